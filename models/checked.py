"""The Python API's costing functions with their arguments checked: a bad workload, order or
tile is one InvalidInput line (a ValueError), never nan, a silent 0, a KeyError or an
AttributeError. The optimizer calls the unchecked models.costmodel versions on its own
candidates."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from . import costmodel
from .errors import InvalidInput
from .hardware import Hardware
from .workload import Workload


def check_workload(workload) -> None:
    if not isinstance(workload, Workload):
        raise InvalidInput(f"workload must be a Workload (from builtin or workload_from_dict), got {type(workload).__name__}")


def check_hardware(hardware, optional: bool = False) -> None:
    if not (isinstance(hardware, Hardware) or (optional and hardware is None)):
        raise InvalidInput(f"hardware must be a Hardware (from preset or hardware_from), got {type(hardware).__name__}")


def check_plan(workload: Workload, orders, tiles, levels: int | None = None) -> None:
    """One order and one tile per level (`levels` of them when given), each valid."""
    costmodel.check_tiles(workload, tiles)
    if isinstance(orders, (str, Mapping)) or not isinstance(orders, Sequence):
        raise InvalidInput(f"orders must be a list with one order per level, got {type(orders).__name__}")
    if len(orders) != len(tiles) or (levels is not None and len(tiles) != levels):
        need = levels if levels is not None else len(tiles)
        raise InvalidInput(f"a plan needs one order and one tile per level ({need}); got {len(orders)} and {len(tiles)}")
    for order in orders:
        costmodel.check_order(workload, order)


def _candidates(tiles) -> list[dict]:
    """Tiles with every value broadcast to one 1-D array of candidates when any value is an array
    (the model costs arrays of candidates, each level's of the same length), else as given."""
    shapes = [np.shape(v) for t in tiles for v in t.values()]
    if all(shape == () for shape in shapes):
        return list(tiles)
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        raise InvalidInput(f"tile arrays must all have one length (or be scalars), got shapes {sorted(set(shapes))}") from None
    if len(shape) != 1:
        raise InvalidInput(f"tile arrays must be one-dimensional, got shape {shape}")
    return [{x: np.broadcast_to(v, shape) for x, v in t.items()} for t in tiles]


def data_volume(workload: Workload, orders: costmodel.Orders, tiles: costmodel.Tiles,
                hardware: Hardware | None = None) -> list[np.ndarray]:
    """DV_l in bytes for every level, innermost first (models.costmodel.data_volume, checked);
    a tile may be a 1-D array of candidates, costed at once."""
    check_workload(workload)
    check_hardware(hardware, optional=True)
    check_plan(workload, orders, tiles, None if hardware is None else len(hardware.levels))
    return costmodel.data_volume(workload, orders, _candidates(tiles), hardware=hardware)


def memory_usage(workload: Workload, tile: Mapping[str, np.ndarray | int]) -> np.ndarray:
    """MU of one level in bytes (models.costmodel.memory_usage, checked)."""
    check_workload(workload)
    costmodel.check_tiles(workload, [tile])
    return costmodel.memory_usage(workload, _candidates([tile])[0])
