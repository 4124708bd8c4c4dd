"""What calibration measured for one state backend, handed to the backend when it is built.

`specframe.plugging.pipeline.assemble` reads the calibration stored for the backend's keys
(`specframe.plugging.calibration`: target, backend name and `StateBackend.cost_options`, device, dtype,
threads) and passes it as `StateBackend.__init__`'s `calibration`; a backend built where none is stored
gets an empty one. A calibration measured later (the first `budget="auto"` request, `specframe calibrate`)
reaches a backend only through a new one built with it: a backend never changes after it is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from specframe.terms.cost import MeasuredCost


@dataclass(frozen=True)
class Calibration:
    """The step cost measured for a backend and the padding measured for it, each None where not measured.

    `min_rows` is the rows the backend pads every forward to, as calibration chose them for a backend
    that leaves its padding to measurement (`StateBackend.pads_by_measurement`); a backend given its
    padding (`kv(min_rows=1)`) ignores it."""

    cost: MeasuredCost | None = None  # the measured step cost (what `specframe calibrate` stores)
    min_rows: int | None = None  # rows to pad every forward to, as measured; None: not measured

    @classmethod
    def of(cls, cost: MeasuredCost | None) -> Calibration:
        """What a stored calibration hands down: its cost, and its padding where it measured one (a
        calibration of a backend given its padding stored the rows it ran at, not a choice)."""
        if cost is None:
            return cls()
        return cls(cost, cost.min_rows if cost.padding_s else None)
