"""Baselines beside the IPC solver, built on its public API only: the bag on Newton's
Vertex Block Descent (:mod:`baselines.vbd_bag`, docs/spec.md §9) and the Verlet
mass-spring cloth (:mod:`baselines.verlet`, docs/spec.md §8)."""
