"""Experiments that train: reproductions and overhead studies (they import recipes and datasets, so they live above eval/)."""
