"""`sparkfleet watch`: keep a lane serving, judged by what it answers, restarting the whole group safely.

    liveness.py    one liveness probe: a tiny checked generation, /health, every rank's container and
                   MemAvailable (the facts round trip, one per node); `judge`/`rank_states` are pure
    policy.py      pure decisions: K failed probes or an exited/vanished rank, the memory guard, the
                   restart budget with growing backoff, the operator's actions that make watch stand down
    supervisor.py  the loop (the only I/O besides liveness.py): probes, evidence, group restarts through
                   the same runner and playbook as `up`/`restore`, signals
    status.py      the state file the exporter reads (metrics), one per watched lane
    unit.py        `watch --unit`: a systemd unit that runs watch (Restart=no: watch owns restarts)
"""
