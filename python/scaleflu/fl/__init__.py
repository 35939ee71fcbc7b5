"""scaleflu.fl: FedAvg runtime, models, data sets and partitions, history store (no GNU Radio).

Modules: ``models`` (LeNet-5, MobileNetV3-Small, ResNet18, sensitivity layers, parameter
groups), ``data`` (data sets, partitions, poisoning, canaries), ``fedavg`` (local training
and aggregation), ``history`` (SQLite + safetensors record of a run), ``run`` (``train`` and
``load_run``). The ``train`` sub-command is :mod:`scaleflu.cli.train`.
"""
