"""Sweeps beyond one machine: cprobe's SLURM launcher. What it stands on lives lower, beside :mod:`cprobe.job`:
:mod:`cprobe.slurmctl` (the SLURM commands cprobe runs, parsed) and :mod:`cprobe.sweep` (a sweep read back: its
manifest and every point's state, the newest attempt's alone, for ``cprobe status``, ``cprobe collect`` and the driver).

- :mod:`cprobe.launch.settings` — the launcher's own settings (``hydra.launcher.*``), each value and the pairs that
  cannot work together (``timeout_min`` against ``signal_delay_s``, sbatch flags a launcher key sets), checked first.
- :mod:`cprobe.launch.resources` — what a sweep asks the scheduler for (GPUs from ``compute=``, CPUs and memory from
  the partition), checked against the partition before anything is submitted.
- :mod:`cprobe.launch.packing` — several sweep points per array task, points sharing a model and data together.
- :mod:`cprobe.launch.slurm` — the Hydra launcher (driver: check, pack, submit, follow) and the array task (run
  its points, mark a point ``interrupted`` on SIGTERM/SIGUSR2 and requeue itself).

The Hydra plugin class lives in ``hydra_plugins.cprobe_launcher`` (Hydra instantiates launchers only from that
namespace); it holds no logic. docs/cluster.md documents the whole.
"""
