"""Direction-finding methods for the 1-D DII, selected by name through ``DIRECTIONS``."""

from cprobe.directions import (das, dbm, kmeans, lda, mean_diff, pca, probe, random, sae_axbench, sae_decoder,
                               sae_diffmean, sae_features, vanilla)
from cprobe.directions.base import DIRECTIONS, Direction, unit

__all__ = ["DIRECTIONS", "Direction", "das", "dbm", "kmeans", "lda", "mean_diff", "pca", "probe", "random",
           "sae_axbench", "sae_decoder", "sae_diffmean", "sae_features", "unit", "vanilla"]
