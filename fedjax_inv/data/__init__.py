"""Dataset sources and federated dataset builders (offline by default)."""

from fedjax_inv.data.colored_mnist import color_digits
from fedjax_inv.data.colored_mnist import make_colored_mnist
from fedjax_inv.data.sources import default_data_dir
from fedjax_inv.data.sources import load_dataset
from fedjax_inv.data.sources import RawDataset

__all__ = [
    "RawDataset",
    "color_digits",
    "default_data_dir",
    "load_dataset",
    "make_colored_mnist",
]
