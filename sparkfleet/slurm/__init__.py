"""Running lanes through a Slurm cluster (inventory launcher: slurm)."""
