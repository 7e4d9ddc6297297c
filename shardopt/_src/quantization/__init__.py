"""Block-wise quantization of optimizer state: code books and block layouts."""
