"""Line searches: backtracking (Armijo) and zoom (strong Wolfe)."""
