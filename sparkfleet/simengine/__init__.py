"""The sim engine: a SIMULATED stand-in for vLLM/TensorFold that the simulated lab launches per rank.

It says it is a simulation: its first log line starts with `SIMULATION:`, every HTTP response has
the header `x-sparkfleet-sim: 1`, and `/v1/models` lists models `owned_by: "sparkfleet-sim"`.
Standard library only, so it runs wherever python3 runs (inside the sim's sandboxes too).

Launch (one process per rank; workers first, then the head, as the seeds did)::

    python -m sparkfleet.simengine --rank R --world-size N --master-addr HOST --master-port P \\
        --host H --port PORT --served-name NAME [--served-name ALIAS ...] --kv-tokens K \\
        [--max-model-len L] [--moe-backend B12X_MXFP4_MXFP8 | --moe-backend "<whole line>"] \\
        [--engram-ranges 'L:start:end,...'] [--engram-node-local] [--engram-dir DIR] \\
        [--autotune-dir DIR [--autotune-shown PATH]] [--rehome-layers N] [--boot-seconds S] [--api-key-env VAR] \\
        [--fault F ...] [--leak-file FILE] [--log FILE] [--step-ms MS] [--prefill-tokens-per-s TPS] \\
        [--num-speculative-tokens K] [--max-num-seqs N] [--text-only] [--no-tools] [--thinking-default] \\
        [--peer-timeout S] [--rendezvous-timeout S] [--keep-alive-on-engine-death] \\
        [--decode-tokens-per-s R] [--execute-model-timeout S] [--ringbuffer-warning-interval S]

or `--config FILE.json` with the same options as keys (`world_size`, `served_names`: [...],
`engram_ranges`: "1:0:96000000" or [[1, 0, 96000000]], `faults`: [...]); flags override the file.
The API key itself is read from the environment variable named by `--api-key-env`, never from argv.

Rendezvous (rendezvous.py): rank 0 listens on master-addr:master-port; workers connect (retrying until
the head listens), join, and boot when the whole world has joined. The head serves only after every
worker reported ready. A head that is already serving still accepts joins, so a relaunched worker that
finds an old head on the port joins it and cannot tell (the seeds' relaunch race); the new head then
fails to bind the master port (`DistNetworkError ... EADDRINUSE`). When the head shuts down it tells
the workers, which exit 0. During boot a rank notices a dead peer --peer-timeout (10 s) after it died,
as NCCL does at its next collective (the rank that crashed logs its fatal line first), prints an NCCL
error and exits 1.

While serving, multi-node vLLM as its source behaves (main.py cites file and function):
- a worker gone (killed, or frozen) is noticed by nothing on the head: `/health` stays 200 (it only asks
  whether the engine core errored). The next request's step waits for that worker; after
  --execute-model-timeout (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, 300 s) the engine core dies on
  `TimeoutError: RPC call to execute_model timed out.`, the waiting requests get a bare 500 (no body)
  and the server exits 1 (with --keep-alive-on-engine-death it stays: `/v1/models` 200, `/health` 503,
  requests 500). While the step waits, shm_broadcast's long-wait line every --ringbuffer-warning-interval.
- a headless worker whose head died blocks: it prints nothing of vLLM's and exits only when stopped.
`kv_tokens` of 0 or less means the default (1,000,000).

Startup lines, in order, spread over --boot-seconds (worker lines are prefixed `(Worker_TP<r> pid=N)`,
head engine lines `(EngineCore_DP0 pid=N)`, API lines `(APIServer pid=N)`)::

    SIMULATION: sparkfleet-sim engine ... (rank R of N); no GPU and no model weights are used
    vLLM API server version 0.0.0+sparkfleet.sim                                  (head)
    world_size=N rank=R local_rank=0 distributed_init_method=tcp://HOST:P backend=nccl
    Starting to load model /models/DeepSeek-V4.1-Flash...
    Using 'B12X_MXFP4_MXFP8' Mxfp4 MoE backend.                                    (--moe-backend)
    Engram DISK mode: layer L rows [start, end)                                     (per --engram-ranges item)
    Engram layer L rows [start, end) read from node-local /engram-local             (--engram-node-local)
    Loading safetensors checkpoint shards:  50% Completed | 24/48 [00:01]
    Model loading took 81.5800 GiB memory and S seconds
    Available KV cache memory: X GiB
    GPU KV cache size: K tokens                                                     (head; min over ranks)
    Maximum concurrency for L tokens per request: X.XXx                             (head)
    [Autotuner]: Loaded N configs from DIR/autotune_configs.json                    (--autotune-dir, filled)
    [Autotuner]: Autotuning process starts ... / ends (silent, one CPU busy)        (--autotune-dir, empty)
    Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|...| 15/15
    Graph capturing finished in S secs, took 1.99 GiB
    rehome done layers=N                                                            (--rehome-layers)
    init engine (profile, create kv cache, warmup model) took S seconds             (head)
    Starting vLLM API server 0 on http://H:PORT, Available routes are:, Route: ...  (head)
    INFO:     Application startup complete.                                         (head; /health is 200 now)

HTTP (head only; the port refuses connections while booting): GET /health (200 serving, 503 after the
engine died), /v1/models,
/metrics (vLLM names, labels model_name and engine), /version; POST /tokenize (vLLM's: the prompt's
token count), /v1/chat/completions and /v1/completions, streamed as SSE with several tokens per event
(one speculative step) and, with stream_options.include_usage, a final usage chunk. With --api-key-env
naming a set variable, /v1 needs `Authorization: Bearer KEY` (401 otherwise).

Answers are worked out from the request (answers.py): counting, needles searched in the prompt, PNG
colours decoded with zlib, tool calls chosen from the request's schemas with arguments read from the
user's text, tool results read back, `reasoning_content` when thinking is on, 400 for
`reasoning_effort: medium`; anything else gets a sentence seeded by a hash of the request. Tokens are
words and punctuation marks (tokens.py), the same count for usage, /tokenize and /metrics. Scheduling
(engine.py) admits by free KV and --max-num-seqs, keeps a prefix cache, preempts when KV runs out.
Timing: each step sleeps --step-ms (4% longer per extra running request); with --decode-tokens-per-s R
the first token comes alone right after prefill and every later step ends when its stream has produced
exactly R tokens per second since that first token (deadlines, so sleep jitter never accumulates): a
benchmark client can be checked against a known rate.

Faults (--fault, repeatable; each should fail one gate and nothing else)::

    worker-crash          the rank dies while loading weights (Traceback + OSError), exit 1
    slow-boot             boot takes --slow-boot-factor (10) times longer
    kv-low                the rank profiles 60% of --kv-tokens, so the lane prints a smaller KV size
    missing-patch         ImportError traceback at model init, exit 1
    engine-fatal          'RuntimeError: CUDA error: an illegal memory access was encountered', exit 1
    engine-warning        a scary WARNING line (mentions a CUDA error) and the boot carries on
    garbage-tokens        every answer is one repeated token ('!'), the drafter accepts nothing
    count-off-by-one      counting answers skip one number
    needle-blind          needle questions are answered 'I could not find ...'
    no-tool-calls         a text answer where a tool call was due
    nondeterministic      identical requests get different text (a random lead-in, unseeded sentences)
    auth-open             the API key is not checked
    stream-usage-missing  streams never send the usage chunk
    memory-leak           each served request adds --leak-mb-per-request (64) MiB; the running total in kB
                          is written (atomically, one integer and a newline) to --leak-file, for the sim
                          lab to subtract from the node's MemAvailable
"""
