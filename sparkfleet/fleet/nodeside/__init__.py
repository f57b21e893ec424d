"""Node-side code, standard library only: the helpers copied to ~/.cache/sparkfleet/bin/ and run with python3
(facts, fabric_probe, nccl_allreduce, engram_copy), and the clock probe's scripts, sent inline as `python3 -c`
(clock_probe)."""
