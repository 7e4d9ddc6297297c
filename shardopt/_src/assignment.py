"""The linear assignment problem (optax's ``optax.assignment``): pair rows and
columns of a cost matrix one to one, ``min(n, m)`` pairs, at the least total
cost, by the Hungarian method with shortest augmenting paths; jittable and
vmappable. Two algorithms, as optax keeps two: ``hungarian_algorithm``
(Jonker & Volgenant's row-by-row form) and ``base_hungarian_algorithm``
(Crouse's); where several assignments are optimal each picks optax's."""

import jax
from jax import lax
import jax.numpy as jnp

__all__ = [
    "base_hungarian_algorithm",
    "hungarian_algorithm",
]


def _add_row(costs: jax.Array, state, row):
  """Assigns ``row`` by one shortest augmenting path (Dijkstra over reduced
  costs ``C - u - v``), then updates the dual potentials so that every
  reduced cost stays >= 0 and is 0 on the assigned pairs.

  Columns and rows are 1-based; column 0 is a virtual column holding the
  row being added, and ``row_of[j] == 0`` means column j is free.
  """
  u, v, row_of = state
  num_rows, num_cols = costs.shape
  row_of = row_of.at[0].set(row + 1)

  def grow(search):
    u, v, visited, slack, came_from, col = search
    visited = visited.at[col].set(True)
    open_cols = ~visited[1:]
    reduced = costs[row_of[col] - 1] - u[row_of[col]] - v[1:]
    reduced = jnp.where(open_cols, reduced, jnp.inf)
    closer = reduced < slack
    came_from = jnp.where(closer, col, came_from)
    slack = jnp.where(closer, reduced, slack)
    next_col = jnp.argmin(jnp.where(open_cols, slack, jnp.inf)) + 1
    delta = jnp.min(jnp.where(open_cols, slack, jnp.inf))
    # Visited columns' rows go up by delta, their columns down: the tree's
    # reduced costs stay 0 and the open columns' slacks drop by delta.
    u = u.at[jnp.where(visited, row_of, num_rows + 1)].add(delta, mode="drop")
    v = jnp.where(visited, v - delta, v)
    slack = jnp.where(open_cols, slack - delta, slack)
    return u, v, visited, slack, came_from, next_col

  search = (u, v, jnp.zeros(num_cols + 1, bool), jnp.full(num_cols, jnp.inf),
            jnp.zeros(num_cols, int), 0)
  u, v, _, _, came_from, free_col = lax.while_loop(
      lambda s: row_of[s[-1]] != 0, grow, search)

  def flip(walk):  # shift the assignments one step back along the path
    row_of, col = walk
    previous = came_from[col - 1]
    return row_of.at[col].set(row_of[previous]), previous

  row_of, _ = lax.while_loop(lambda w: w[1] != 0, flip, (row_of, free_col))
  return (u, v, row_of), None


def _matching(cost_matrix: jax.Array):
  """Solves over the shorter side (transposing a tall matrix).

  Returns ``(transposed, row_of, col_of)``: ``row_of[c]`` is the short-side
  row assigned to column ``c`` (-1: free), ``col_of[r]`` the column of
  short-side row ``r`` (every row is assigned).
  """
  transposed = cost_matrix.shape[0] > cost_matrix.shape[1]
  costs = cost_matrix.T if transposed else cost_matrix
  costs = costs.astype(jnp.result_type(float))
  num_rows, num_cols = costs.shape
  start = (jnp.zeros(num_rows + 1, costs.dtype), jnp.zeros(num_cols + 1, costs.dtype),
           jnp.zeros(num_cols + 1, int))
  (_, _, row_of), _ = lax.scan(
      lambda state, row: _add_row(costs, state, row), start, jnp.arange(num_rows))
  row_of = row_of[1:] - 1  # 0-based; -1: a free column
  col_of = jnp.zeros(num_rows, int).at[jnp.where(row_of < 0, num_rows, row_of)].set(
      jnp.arange(num_cols), mode="drop")
  return transposed, row_of, col_of


def _empty() -> tuple[jax.Array, jax.Array]:
  return jnp.zeros(0, int), jnp.zeros(0, int)


def hungarian_algorithm(cost_matrix: jax.Array) -> tuple[jax.Array, jax.Array]:
  """An optimal assignment for an ``(n, m)`` cost matrix.

  Rows are added one at a time (over the shorter side); each is assigned by
  a shortest augmenting path in the reduced costs, keeping dual potentials
  ``u`` (rows) and ``v`` (columns) with ``C - u - v >= 0``, so the final
  assignment is optimal. O(min(n, m)**2 * max(n, m)) work.

  Args:
    cost_matrix: an ``(n, m)`` matrix of costs.

  Returns:
    ``(i, j)``: ``min(n, m)`` row and column indices (int), in optax's
    order: ``j`` increasing (``arange(n)``) for a square matrix, else the
    shorter side's indices decreasing (``i`` for ``n < m``, ``j`` for
    ``n > m``); the assignment's cost is ``cost_matrix[i, j].sum()``.

  Example:
    >>> import jax.numpy as jnp
    >>> import shardopt
    >>> cost = jnp.array([[8, 4, 7], [5, 2, 3], [9, 6, 7], [9, 4, 8]])
    >>> i, j = shardopt.assignment.hungarian_algorithm(cost)
    >>> print("i:", i, "j:", j, "cost:", cost[i, j].sum())
    i: [1 3 0] j: [2 1 0] cost: 15

  References:
    Kuhn, "The Hungarian method for the assignment problem", Naval Research
    Logistics Quarterly 1955 (https://doi.org/10.1002/nav.3800020109);
    Jonker & Volgenant, "A shortest augmenting path algorithm for dense and
    sparse linear assignment problems", Computing 1987
    (https://doi.org/10.1007/BF02278710); Crouse, "On implementing 2D
    rectangular assignment algorithms", IEEE TAES 2016
    (https://doi.org/10.1109/TAES.2016.140952).
  """
  if cost_matrix.shape[0] == 0 or cost_matrix.shape[1] == 0:
    return _empty()
  transposed, row_of, col_of = _matching(cost_matrix)
  if row_of.shape == col_of.shape:  # square: the row of each column
    return row_of, jnp.arange(row_of.shape[0])
  short = jnp.arange(col_of.shape[0])[::-1]
  return (col_of[short], short) if transposed else (short, col_of[short])


def _shortest_path_search(costs, u, v, path, row4col, row):
  """Crouse's search for an augmenting path from ``row`` (Dijkstra over the
  reduced costs ``C - u - v``): returns ``(sink, lowest, seen_rows,
  seen_cols, slack, path)``, ``sink`` the free column it ends at.

  Unvisited columns are kept in ``remaining``, first scanned last to first;
  a visited column's slot takes the last unvisited one. Of the columns at
  the least slack, the last free one in that order is visited next, else
  the first one (the tie rule of the paper's pseudocode, as optax's and
  scipy's implementations break ties).
  """
  num_rows, num_cols = costs.shape
  positions = jnp.arange(num_cols)

  def visit(search):
    remaining, left, slack, path, seen_rows, seen_cols, i, base, _ = search
    seen_rows = seen_rows.at[i].set(True)
    open_positions = positions < left
    cols = jnp.where(open_positions, remaining, num_cols)  # num_cols: dropped
    reduced = base + costs[i, remaining] - u[i] - v[remaining]
    closer = reduced < slack[remaining]
    path = path.at[cols].set(jnp.where(closer, i, path[remaining]), mode="drop")
    slack = slack.at[cols].min(reduced, mode="drop")
    at_position = jnp.where(open_positions, slack[remaining], jnp.inf)
    lowest = jnp.min(at_position)
    tied = open_positions & (at_position == lowest)
    free = tied & (row4col[remaining] == -1)
    last_free = num_cols - 1 - jnp.argmax(free[::-1])
    index = jnp.where(free.any(), last_free, jnp.argmax(tied))
    col = remaining[index]
    is_free = row4col[col] == -1
    sink = jnp.where(is_free, col, -1)
    i = jnp.where(is_free, i, row4col[col])
    seen_cols = seen_cols.at[col].set(True)
    left = left - 1
    remaining = remaining.at[index].set(remaining[left])
    return remaining, left, slack, path, seen_rows, seen_cols, i, lowest, sink

  search = (positions[::-1], num_cols, jnp.full(num_cols, jnp.inf, costs.dtype),
            path, jnp.zeros(num_rows, bool), jnp.zeros(num_cols, bool), row,
            jnp.zeros((), costs.dtype), -1)
  _, _, slack, path, seen_rows, seen_cols, _, lowest, sink = lax.while_loop(
      lambda s: s[-1] == -1, visit, search)
  return sink, lowest, seen_rows, seen_cols, slack, path


def _crouse_add_row(costs, state, row):
  """Assigns ``row`` by ``_shortest_path_search``'s path, then updates the
  dual potentials (rows ``u``, columns ``v``) as Crouse's pseudocode does."""
  u, v, path, row4col, col4row = state
  sink, lowest, seen_rows, seen_cols, slack, path = _shortest_path_search(
      costs, u, v, path, row4col, row)
  u = u.at[row].add(lowest)
  others = seen_rows & (jnp.arange(costs.shape[0]) != row)
  u = jnp.where(others, u + lowest - slack[col4row], u)
  v = jnp.where(seen_cols, v + slack - lowest, v)

  def flip(walk):  # assign each column on the path to the row before it
    row4col, col4row, col, _ = walk
    i = path[col]
    return row4col.at[col].set(i), col4row.at[i].set(col), col4row[i], i == row

  row4col, col4row, _, _ = lax.while_loop(
      lambda w: ~w[-1], flip, (row4col, col4row, sink, False))
  return (u, v, path, row4col, col4row), None


def base_hungarian_algorithm(cost_matrix: jax.Array) -> tuple[jax.Array, jax.Array]:
  """An optimal assignment for an ``(n, m)`` cost matrix by Crouse's
  shortest augmenting path algorithm, the one optax keeps under this name:
  rows added in order, ties broken as the paper's pseudocode breaks them,
  so the same assignment as optax's where several are optimal.

  Args:
    cost_matrix: an ``(n, m)`` matrix of costs.

  Returns:
    ``(i, j)``: ``min(n, m)`` row and column indices (int), ``i``
    increasing; the assignment's cost is ``cost_matrix[i, j].sum()``.

  References:
    Crouse, "On implementing 2D rectangular assignment algorithms", IEEE
    TAES 2016 (https://doi.org/10.1109/TAES.2016.140952).
  """
  if cost_matrix.shape[0] == 0 or cost_matrix.shape[1] == 0:
    return _empty()
  transposed = cost_matrix.shape[0] > cost_matrix.shape[1]
  costs = (cost_matrix.T if transposed else cost_matrix).astype(
      jnp.result_type(float))
  num_rows, num_cols = costs.shape
  start = (jnp.zeros(num_rows, costs.dtype), jnp.zeros(num_cols, costs.dtype),
           jnp.full(num_cols, -1), jnp.full(num_cols, -1), jnp.full(num_rows, -1))
  (_, _, _, _, col4row), _ = lax.scan(
      lambda state, row: _crouse_add_row(costs, state, row), start,
      jnp.arange(num_rows))
  if not transposed:
    return jnp.arange(num_rows), col4row
  order = jnp.argsort(col4row)  # the long side (the original rows) increasing
  return col4row[order], order
