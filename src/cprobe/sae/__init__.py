"""Sparse autoencoders: the dictionary (:mod:`.dictionary`), its quality (:mod:`.quality`), training
(:mod:`.train`), SAELens's folder format (:mod:`.saelens`), the cache of trained ones (:mod:`.store`) and the rules
that pick a property's latents (:mod:`.select`). The methods built on them are the ``sae`` direction
(:mod:`cprobe.directions.sae`) and the ``sae_latents`` intervention
(:mod:`cprobe.interventions.sae_latents`); docs/sae.md."""
