"""The LSTM state a group starts from: all zeros (deterministic calls), or the state carried
from the previous group (``stateful=True``), split over the devices by rows (axis 2 of each
``[layers, directions, rows, dim]`` leaf)."""

from __future__ import annotations

import jax

from elmo_jax.config import ElmoConfig
from elmo_jax.embedding.devices import Placement
from elmo_jax.model.lstm import zero_state

ROWS_AXIS = 2


class LstmStates:
    """Zero states per row count (made once: arrays are immutable) and the carried state of
    ``n_carried`` rows (row ``i`` of a stateful group continues row ``i``)."""

    def __init__(self, config: ElmoConfig, placement: Placement, n_carried: int):
        self.config = config
        self.placement = placement
        self.n_carried = n_carried
        self.carried: dict | None = None
        self._zeros: dict[int, dict] = {}

    def zeros(self, n_rows: int) -> dict:
        if n_rows not in self._zeros:
            self._zeros[n_rows] = self.placement.put_rows(zero_state(self.config, n_rows), ROWS_AXIS)
        return self._zeros[n_rows]

    def start(self, n_rows: int, stateful: bool) -> dict:
        """The state a group of ``n_rows`` rows starts from."""
        if not stateful:  # an explicit zero state: stateless and stateful calls share one executable
            return self.zeros(n_rows)
        if self.carried is None:
            self.carried = self.zeros(self.n_carried)
        if n_rows == self.n_carried:
            return self.carried
        return self.placement.put_rows(jax.tree.map(lambda s: s[:, :, :n_rows], self.carried), ROWS_AXIS)

    def carry(self, n_rows: int, new: dict) -> None:
        """Keep ``new`` (the state after a stateful group of ``n_rows`` rows)."""
        if n_rows == self.n_carried:  # placed as the zeros are: the next group reuses their executable
            self.carried = self.placement.put_rows(new, ROWS_AXIS)
        else:
            self.carried = self.placement.put_rows(
                jax.tree.map(lambda old, s: old.at[:, :, :n_rows].set(s), self.carried, new), ROWS_AXIS
            )

    def reset(self) -> None:
        self.carried = None
