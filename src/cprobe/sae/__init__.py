"""Sparse autoencoders: the dictionary (:mod:`.dictionary`), its quality (:mod:`.quality`), training
(:mod:`.train`), SAELens's folder format (:mod:`.saelens`), the cache of trained ones (:mod:`.store`) and the rules
that pick a property's latents (:mod:`.select`, AxBench's rules on texts too). The methods built on them are cprobe's
``sae_decoder`` direction (:mod:`cprobe.directions.sae_decoder`) and ``sae_latents`` intervention
(:mod:`cprobe.interventions.sae_latents`), and AxBench's SAE (:mod:`cprobe.directions.sae_axbench`) and SAE-DiffMean
(:mod:`cprobe.directions.sae_diffmean`); docs/sae.md."""
