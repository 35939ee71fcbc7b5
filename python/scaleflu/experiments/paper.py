"""The paper's Table II (scale-paper.tex, ``tab:main_results``): RA, FA and Avg AoI per cell.

Keyed by ``(dataset, scenario, model)`` with the harness's names (``fashion_mnist`` /
``cifar100``; ``client`` / ``class`` / ``sample``; ``lenet`` / ``mobilenetv3`` / ``resnet18``);
each value maps a method (``retrain``, ``fedraser``, ``pga``, ``fused``, ``scale``) to its
``(RA, FA, Avg AoI in s)``. The report prints these beside every measured cell
(:func:`paper_value`); the paper has no value for the fine-tune controls, the trained model,
the true-label or the MIA columns.
"""

from __future__ import annotations

METHODS = ("retrain", "fedraser", "pga", "fused", "scale")

# (dataset, scenario, model): RA x 5, FA x 5, AoI x 5 in METHODS order, as printed in the paper
_ROWS: dict[tuple[str, str, str], tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]]
_ROWS = {
    ("fashion_mnist", "client", "lenet"): (
        (0.92, 0.74, 0.78, 0.99, 0.82),
        (0.00, 0.12, 0.09, 0.00, 0.00),
        (2.59, 3.00, 2.66, 1.65, 2.01),
    ),
    ("fashion_mnist", "client", "mobilenetv3"): (
        (0.92, 0.81, 0.83, 0.81, 0.86),
        (0.01, 0.11, 0.12, 0.04, 0.00),
        (2.66, 2.91, 2.71, 1.74, 2.16),
    ),
    ("fashion_mnist", "client", "resnet18"): (
        (0.96, 0.81, 0.84, 0.83, 0.87),
        (0.04, 0.21, 0.18, 0.08, 0.01),
        (6.75, 7.18, 6.82, 4.39, 5.99),
    ),
    ("cifar100", "client", "lenet"): (
        (0.38, 0.30, 0.32, 0.42, 0.36),
        (0.01, 0.18, 0.14, 0.02, 0.01),
        (2.85, 3.21, 2.93, 2.13, 2.21),
    ),
    ("cifar100", "client", "mobilenetv3"): (
        (0.62, 0.51, 0.54, 0.55, 0.58),
        (0.02, 0.16, 0.13, 0.06, 0.02),
        (2.93, 3.18, 2.99, 1.89, 2.34),
    ),
    ("cifar100", "client", "resnet18"): (
        (0.71, 0.58, 0.60, 0.61, 0.65),
        (0.05, 0.24, 0.21, 0.10, 0.04),
        (7.28, 7.71, 7.34, 4.71, 6.41),
    ),
    ("fashion_mnist", "class", "lenet"): (
        (0.90, 0.73, 0.76, 0.99, 0.81),
        (0.08, 0.27, 0.20, 0.04, 0.00),
        (2.72, 3.07, 2.64, 1.68, 2.09),
    ),
    ("fashion_mnist", "class", "mobilenetv3"): (
        (0.91, 0.78, 0.81, 0.73, 0.87),
        (0.04, 0.17, 0.15, 0.21, 0.02),
        (2.79, 3.14, 2.88, 1.73, 2.19),
    ),
    ("fashion_mnist", "class", "resnet18"): (
        (0.96, 0.78, 0.80, 0.73, 0.86),
        (0.00, 0.19, 0.16, 0.08, 0.00),
        (6.89, 7.08, 6.78, 4.52, 6.02),
    ),
    ("cifar100", "class", "lenet"): (
        (0.36, 0.28, 0.30, 0.40, 0.34),
        (0.10, 0.32, 0.24, 0.05, 0.01),
        (2.97, 3.31, 2.85, 1.60, 2.29),
    ),
    ("cifar100", "class", "mobilenetv3"): (
        (0.61, 0.49, 0.52, 0.46, 0.57),
        (0.05, 0.21, 0.19, 0.25, 0.03),
        (3.04, 3.39, 3.13, 1.87, 2.37),
    ),
    ("cifar100", "class", "resnet18"): (
        (0.69, 0.55, 0.57, 0.49, 0.62),
        (0.01, 0.23, 0.20, 0.11, 0.01),
        (7.42, 7.62, 7.31, 4.84, 6.47),
    ),
    ("fashion_mnist", "sample", "lenet"): (
        (0.89, 0.73, 0.74, 0.99, 0.77),
        (0.02, 0.15, 0.13, 0.05, 0.09),
        (2.69, 3.03, 2.75, 1.65, 2.06),
    ),
    ("fashion_mnist", "sample", "mobilenetv3"): (
        (0.88, 0.76, 0.79, 0.75, 0.82),
        (0.01, 0.18, 0.14, 0.18, 0.10),
        (2.81, 3.29, 2.92, 1.71, 2.68),
    ),
    ("fashion_mnist", "sample", "resnet18"): (
        (0.92, 0.80, 0.81, 0.54, 0.84),
        (0.01, 0.22, 0.17, 0.13, 0.10),
        (6.92, 7.12, 6.85, 4.52, 5.99),
    ),
    ("cifar100", "sample", "lenet"): (
        (0.34, 0.27, 0.28, 0.39, 0.31),
        (0.04, 0.19, 0.16, 0.07, 0.12),
        (2.89, 3.27, 2.96, 1.53, 2.24),
    ),
    ("cifar100", "sample", "mobilenetv3"): (
        (0.58, 0.47, 0.50, 0.45, 0.53),
        (0.03, 0.22, 0.18, 0.21, 0.13),
        (3.07, 3.54, 3.18, 2.21, 2.86),
    ),
    ("cifar100", "sample", "resnet18"): (
        (0.66, 0.54, 0.55, 0.32, 0.58),
        (0.02, 0.26, 0.21, 0.16, 0.13),
        (7.46, 7.66, 7.39, 4.15, 6.43),
    ),
}

_METRICS = {"RA": 0, "FA": 1, "AoI_s": 2}


def paper_value(dataset: str, scenario: str, model: str, method: str, metric: str) -> float | None:
    """The paper's Table II value of a cell, or None where the paper has none.

    ``scenario`` is the table's scenario name (``client`` / ``class`` / ``sample``); ``metric``
    is the report's ``RA``, ``FA`` or ``AoI_s``.
    """
    row = _ROWS.get((dataset, scenario, model))
    if row is None or method not in METHODS or metric not in _METRICS:
        return None
    return row[_METRICS[metric]][METHODS.index(method)]
