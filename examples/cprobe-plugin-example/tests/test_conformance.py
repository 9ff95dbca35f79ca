"""The conformance checks cprobe's own methods pass, on this package's methods (one pytest case per check)."""

from cprobe.plugin import parametrize_with_checks


@parametrize_with_checks(["spectral", "trimmed_mean", "mean_shift", "edit_norm"])
def test_conformance(subject, check):
    check(subject)
