"""zoo.datasets: LightningDataModules and generators for the built-in datasets."""
