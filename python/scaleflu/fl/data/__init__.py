"""Data of a federation: data sets, client partitions, poisoning and membership canaries.

``images`` (:class:`ImageData`, raw ``uint8`` images normalised on access), ``datasets``
(FashionMNIST and CIFAR-100 from their official files), ``partition`` (IID, Dirichlet, grown
clients), ``poison`` (backdoor trigger, label flips, the poisoned evaluation variants) and
``canaries`` (memorised samples with held-out twins). The names below are the package's API.
"""

from scaleflu.fl.data.canaries import insert_canaries
from scaleflu.fl.data.datasets import (
    CIFAR100_DIR,
    CIFAR100_MD5,
    CIFAR100_RECORD,
    CIFAR100_URL,
    DATASET_NAMES,
    FASHION_MNIST_DIR,
    FASHION_MNIST_FILES,
    FASHION_MNIST_URL,
    DataError,
    download_file,
    image_data,
    load_cifar100,
    load_datasets,
    load_fashion_mnist,
    load_npz,
    load_plugin_dataset,
    read_cifar100_bin,
    read_idx,
)
from scaleflu.fl.data.images import ImageData
from scaleflu.fl.data.partition import (
    grow_clients,
    make_partitions,
    partition_dirichlet,
    partition_iid,
)
from scaleflu.fl.data.poison import (
    FLIP_MODES,
    PoisonInfo,
    add_marker,
    add_trigger,
    apply_poison,
    flip_labels,
    poisoned_like,
    triggered_test_set,
)

__all__ = [
    "CIFAR100_DIR",
    "CIFAR100_MD5",
    "CIFAR100_RECORD",
    "CIFAR100_URL",
    "DATASET_NAMES",
    "DataError",
    "FASHION_MNIST_DIR",
    "FASHION_MNIST_FILES",
    "FASHION_MNIST_URL",
    "FLIP_MODES",
    "ImageData",
    "PoisonInfo",
    "add_marker",
    "add_trigger",
    "apply_poison",
    "download_file",
    "flip_labels",
    "grow_clients",
    "image_data",
    "insert_canaries",
    "load_cifar100",
    "load_datasets",
    "load_fashion_mnist",
    "load_npz",
    "load_plugin_dataset",
    "make_partitions",
    "partition_dirichlet",
    "partition_iid",
    "poisoned_like",
    "read_cifar100_bin",
    "read_idx",
    "triggered_test_set",
]
