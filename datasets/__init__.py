"""zoo.datasets: LightningDataModules and generators for the built-in datasets."""
from .synthetic_data import SyntheticLMDataModule  # noqa: F401,E402  (issue 7: synthetic reasoning tasks)
