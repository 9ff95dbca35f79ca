"""Kept for imports written before the solver moved: the one implementation is :mod:`cprobe.stats`."""

from cprobe.stats import fit_logistic, l2_for_C, log_loss_and_accuracy

__all__ = ["fit_logistic", "l2_for_C", "log_loss_and_accuracy"]
