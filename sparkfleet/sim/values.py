"""Simulation inputs: every number and name the simulated lab shows that the seeds do not give.

THESE ARE SIMULATION INPUTS, NOT MEASUREMENTS. The seeds give GB10's 121 GiB of unified
memory, GB300's 494 GiB of Grace RAM and 250.7 GiB of HBM, earlyoom at 2 % on GB10, the 630-950 MHz
clock latch, the 100 GiB MemAvailable floor, GID index 3 and the Station's XFS /models; those come
from the inventory's hardware classes or are quoted where used. Everything in this module (idle
clocks, power draw, pids, MAC addresses, uptimes, container ids, ...) was chosen to look plausible
and to sit clearly on one side of each threshold the checks use. Change them here, nowhere else.
"""

from __future__ import annotations

from typing import Any

# Per hardware class: what nvidia-smi and /proc show when the node is healthy.
HARDWARE: dict[str, dict[str, Any]] = {
    "gb10": {
        "gpu_name": "NVIDIA GB10",
        "max_sm_mhz": 3003,  # clocks.max.sm, as in docs/sim-layout.md's example line
        "idle_sm_mhz": 208,
        "load_sm_mhz": 3003,  # a healthy GPU under load runs at its max SM clock, reason 0x0
        "idle_power_w": 4.8,
        "load_power_w": 35.2,
        "memory_total_mib": None,  # unified memory: nvidia-smi prints [N/A] (REFERENCE §4)
        "memory_used_mib": None,
        "driver": "580.95.05",
        "cuda": "13.0",
        "used_gib": 4.0,  # RAM in use on an idle node after dropping caches: MemAvailable = 117 GiB
        "low_memory_gib": 80.0,  # low-memory fault default: below the 100 GiB rank floor (HLT-03)
        "swap_gib": 0,
        "cpus": 20,
        "uptime_s": 261234.56,
        "earlyoom_args_default": ["-r", "3600"],  # Debian's /etc/default/earlyoom (REFERENCE §5)
    },
    "gb300": {
        "gpu_name": "NVIDIA GB300",
        "max_sm_mhz": 2032,
        "idle_sm_mhz": 345,
        "load_sm_mhz": 2032,
        "idle_power_w": 115.4,
        "load_power_w": 880.0,
        "memory_total_mib": 256717,  # 250.7 GiB of visible HBM (INV-50), in MiB
        "memory_used_mib": 0,
        "driver": "595.84",  # INV-56
        "cuda": "13.0",
        "used_gib": 14.0,  # idle Grace: MemAvailable = 480 GiB
        "low_memory_gib": 8.0,  # low-memory fault default: below the 10 GiB pin-hot host floor (FM-43)
        "swap_gib": 0,  # INV-57: "no swap"
        "cpus": 72,
        "uptime_s": 93784.12,
        "earlyoom_args_default": ["-r", "3600"],
    },
}

MEM_CACHED_GIB = 1.0  # page cache left after dropping caches (part of MemAvailable)
MEM_BUFFERS_MIB = 64
# sim-gpu-load's step timings: 63 ms back to back and 94 ms after idle in the slow state are the seeds'
# GB10 decode steps (FM-10); the sim reuses them for its stand-in load on every hardware class.
STEP_MS = 63.0
SLOW_AFTER_IDLE_MS = 94.0
CLOCK_LATCH_MHZ = 780  # clock-latch fault default: inside GB10's 630-950 MHz latch band (INV-15)
IDLE_FRACTION = 0.97  # /proc/uptime's idle seconds = uptime * cpus * this

# Mounts every node has; `/` is the node's own NVMe (ext4), which is where a GB10 head keeps its model root.
BASE_MOUNTS: list[tuple[str, str, str, str]] = [
    ("sysfs", "/sys", "sysfs", "rw,nosuid,nodev,noexec,relatime"),
    ("proc", "/proc", "proc", "rw,nosuid,nodev,noexec,relatime"),
    ("udev", "/dev", "devtmpfs", "rw,nosuid,relatime,mode=755,inode64"),
    ("tmpfs", "/run", "tmpfs", "rw,nosuid,nodev,noexec,relatime,size=12689396k,mode=755,inode64"),
    ("/dev/nvme0n1p2", "/", "ext4", "rw,relatime,errors=remount-ro"),
    ("/dev/nvme0n1p1", "/boot/efi", "vfat", "rw,relatime,fmask=0077,dmask=0077,codepage=437,iocharset=iso8859-1"),
]
# A model root that is its own filesystem on a model-local node, by hardware class (GB300: INV-53, RAID0 XFS).
LOCAL_MODEL_MOUNT: dict[str, tuple[str, str, str]] = {
    "gb300": ("/dev/md0", "xfs", "rw,relatime,attr2,inode64,logbufs=8,logbsize=32k,sunit=1024,swidth=2048,noquota"),
}
NFS4_OPTIONS = ("vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,"
                "clientaddr={client},local_lock=none,addr={server}")
# cifs-model fault: the model root served from the archive NAS over SMB (INV-61 names Milo-Ark; FM-44).
CIFS_SOURCE = "//milo-ark/models"
CIFS_OPTIONS = ("rw,relatime,vers=3.1.1,cache=strict,username=milo,uid=0,noforceuid,gid=0,noforcegid,"
                "addr=10.10.0.50,file_mode=0755,dir_mode=0755,soft,nounix,serverino,mapposix,rsize=4194304,"
                "wsize=4194304,bsize=1048576,echo_interval=60,actimeo=1,closetimeo=1")

# Processes the sim pretends run on every node (pid, comm, argv, listening (address, port) pairs).
PIDS = {"rpcbind": 812, "sshd": 1034, "earlyoom": 1187}
SSHD_ARGV = ["sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups"]
RPCBIND_ARGV = ["/sbin/rpcbind", "-f", "-w"]
EARLYOOM_BIN = "/usr/bin/earlyoom"  # systemd's ExecStart=/usr/bin/earlyoom $EARLYOOM_ARGS
CONTAINER_PID_BASE = 50000  # the main process of the sim's N-th container gets pid BASE + N
CONTAINER_COMM = "python3"

# RDMA: GID tables are this long (real ConnectX tables hold 255; the sim keeps the first 16).
GID_TABLE_SIZE = 16
MAC_PREFIX = "02:5f:46"  # locally administered: node ordinal and HCA ordinal fill the rest
IPV6_GLOBAL_PREFIX = "fd5f:4600:0:192"  # wrong-gid fault: a global IPv6 address sorts before the IPv4 entries
PORT_RATE = "200 Gb/sec (4X HDR)"  # INV-21: 200G fabric

# Docker: image metadata (ids and digests are derived from the ref with sha256, so they are stable).
IMAGE_CREATED = "2026-10-17T03:36:00.000000000Z"
IMAGE_SIZE = 21474836480
DOCKER_SERVER_VERSION = "28.3.3"
STOP_EXIT_CODE = 0  # what `docker stop` leaves as ExitCode (a server that exits cleanly on SIGTERM)
KILL_EXIT_CODE = 137

# port-taken fault: a lane somebody else started by hand (FM-48: a GLM lane live on :30001 during a launch).
FOREIGN_IMAGE = "vllm/vllm-openai:glm-5.3"
FOREIGN_LABELS = {"com.example.owner": "someone-else", "com.example.lane": "glm-5.3"}
FOREIGN_STARTED_AT = "2026-11-28T22:14:09.512873041Z"
FOREIGN_PID = 48250


# -- the sim engine that `docker run` starts for a sparkfleet lane (simulation inputs, not measurements) --
ENGINE_BOOT_S = 0.5  # the seeds' Spark boot takes ~11 min (LCH-14); the sim compresses it to half a second
# The weights a rank loads (the engine's "Model loading took" line, and what a memory-utilisation budget loses to
# them): the seeds' one published per-rank figure, boot 10's TP4 rank incl. draft + vision (PRF-S
# "Expected memory: weights per rank incl. draft + vision 81.58 GiB"). The sim has no other checkpoint size.
ENGINE_MODEL_GIB = (8158, 100)  # as a fraction: 81.58 GiB
# The MoE layers the GB300 pin-hot hook re-homes (its "rehome done layers=N" line, HLT-27): INV-74,
# "40 MoE layers x 384 MXFP4 experts".
MOE_LAYERS = 40
# The hook is on when the launch carries it (LCH-G4): its sitecustomize.py bound over the image's
# Python site file and PIN_HOOK naming the hook module.
PIN_HOOK_ENV = "PIN_HOOK"
PIN_HOOK_SITE = "sitecustomize.py"
# vLLM's default --gpu-memory-utilization when a launch gives neither it nor --kv-cache-memory-bytes
# (vLLM EngineArgs.gpu_memory_utilization = 0.9).
VLLM_DEFAULT_GMU = (9, 10)
ENGRAM_TABLE_ROWS = 384_000_000  # ENG-01: 384 million rows per table; a rank reads its 1/TP share (ENG-03).
# Used only for a checkpoint dir without Engram headers (the nodes hold a stand-in with them: ENGRAM_STANDIN_ROWS).
ENGRAM_LAYERS = (1, 14)  # ENG-01
# The name of layer L's Engram values tensor in a checkpoint the sim reads rows from (the sim's own choice, the
# same as the test checkpoints of sparkfleet/engram/safetensors.py; the seeds do not name the tensors).
ENGRAM_TENSOR = "model.layers.{layer}.engram.embed.weight"
# The checkpoint a sim node holds in each vLLM lane's snapshot dir: a STAND-IN for the ~150 GB checkpoint a real
# node holds (INV-30), with only what the Engram path reads: ENGRAM_LAYERS' tables in shards 47 and 48 (ENG-04)
# under ENGRAM_TENSOR (values F8_E4M3 plus per-32 scales, or NVFP4's for an nvfp4 lane), other tensors around
# them, a shard without Engram tensors and the index (sparkfleet.engram.safetensors.make_checkpoint writes it).
# Its tables have the sim's own size, not the real 384 M rows: small enough that the real copier copies a rank's
# quarter in milliseconds and the engine re-hashes it at every launch. The engine reads the size from the headers.
ENGRAM_STANDIN_ROWS = 4096
ENGRAM_STANDIN_WIDTH = 64  # values per row (fp8: 64 bytes + 2 scale bytes a row)
ENGINE_STOP_WAIT_S = 10.0  # `docker stop`'s default grace before SIGKILL
# The Station's FlashInfer autotune of the MXFP4 MoE kernel ([000] "FlashInfer autotunes the MXFP4 MoE kernel by
# running every tactic on the real hardware"; the Spark lanes run b12x's kernels and tune nothing in the seeds):
AUTOTUNE_GPUS = ("NVIDIA GB300",)
# vLLM's cache root in the container (VLLM_CACHE_ROOT, default ~/.cache/vllm; the lanes bind the persistent one
# there, INV-55: "-v /home/milo/dsv41/vllm-cache:/root/.cache/vllm"); the tuner's hash dirs lie under this subdir
# of it, one per engine-config hash. The seeds name only "a new hash directory" and its autotune_configs.json; the
# subdir is the name a vLLM log of FlashInfer's warmup shows (it nests FlashInfer's version and the GPU arch too,
# which the sim leaves out).
AUTOTUNE_CACHE = "/root/.cache/vllm"
AUTOTUNE_SUBDIR = "flashinfer_autotune_cache"
# The engine-config hash inputs the seeds name (LCH-G2: --max-num-seqs, the speculative config, --max-model-len,
# the capture list; "First boot on a new image: 75-90 min", LCH-G3: the image too).
AUTOTUNE_HASH_FLAGS = ("--max-num-seqs", "--speculative-config", "--max-model-len", "--cudagraph-capture-sizes")
AUTOTUNE_CONFIGS = 168  # [000] "The 168 tuned configs are cached under /root/.cache/vllm"
# A cold tune on the sim's time scale (ENGINE_BOOT_S for the Sparks' ~11 min boot): the seeds' 74 minutes ([000]).
AUTOTUNE_TUNE_S = ENGINE_BOOT_S * 74 / 11
# When the tuner reads the hash dir: "roughly two minutes after the KV gate" ([000]). NOT on the sim's time scale
# (that would be 0.09 s): `up` polls in real seconds (every 1 s by default, 0.2 s in the tests), and a real Station
# gives those polls minutes; three seconds give a poll several chances, as the real two minutes do.
AUTOTUNE_READ_S = 3.0

# `--moe-backend NAME` -> the kernel vLLM names in its MoE line, for the lab's MXFP4 checkpoint: b12x prints
# "Using 'B12X_MXFP4_MXFP8' Mxfp4 MoE backend." (HLT-21, [003]). A backend not listed here gets
# its own name upper-cased: the sim cannot know what another image prints.
MOE_KERNELS = {"b12x": "B12X_MXFP4_MXFP8"}

# KV cache size from the launch's --kv-cache-memory-bytes B and DCP size D: tokens = floor((B - KV_RESERVED_BYTES)
# * D / KV_BYTES_PER_TOKEN). Both constants are calibrated once, exactly, from the seeds' two published pairs
# (HLT-20, OQ-05): 8 GiB at DCP1 gives 1,263,118 tokens and 6 GiB at DCP2 gives 1,888,800. Two GiB
# more at DCP1 buy 1,263,118 - 1,888,800/2 = 318,718 tokens, so a token costs 2 GiB / 318,718 bytes, and
# what the budget keeps back is 8 GiB - 1,263,118 tokens' worth (about 75 MiB).
KV_BYTES_PER_TOKEN = (2 * 2**30, 318_718)  # as a fraction (numerator, denominator): 6,737.88 bytes
KV_RESERVED_BYTES = (8 * 2**30 * 318_718 - 1_263_118 * 2 * 2**30, 318_718)  # fraction: 79,197,041.9 bytes
# A launch that sizes KV by --gpu-memory-utilization U instead: vLLM budgets U x the GPU's memory (on GB10's
# unified memory that is the node's MemTotal, INV-10; else nvidia-smi's memory.total) and gives KV what the
# weights and the rest (activations, CUDA graphs, non-torch allocations) leave. "The rest" is calibrated once,
# exactly, from the seeds' one gmu-sized pair with known weights: boot 10 at gmu 0.80 on a 121 GiB Spark with
# 81.58 GiB of weights per rank logged 1,070,168 tokens (HLT-20, INV-10, PRF-S boot 10), i.e.
# 0.80 x 121 GiB - 81.58 GiB - (KV_RESERVED_BYTES + 1,070,168 tokens' worth) = about 8.43 GiB.
# As a fraction (numerator, denominator) over the common denominator 100 x 318,718:
GMU_OTHER_BYTES = (80 * 121 * 2**30 * 318_718 - 8158 * 2**30 * 318_718
                   - (8 * 2**30 * 318_718 - 1_263_118 * 2 * 2**30) * 100 - 1_070_168 * 2 * 2**30 * 100,
                   100 * 318_718)

# Link faults (ssh mode as root, where each node has its own network namespace and fabric interface):
SLOW_LINK_RATE = "100mbit"  # slow-link default: tc tbf's rate, far below the 200G fabric (INV-21)
# tbf's bucket must hold a whole frame: TESTBED.md's `burst 32kbit` (4,000 bytes) was checked on an MTU
# 1500 link, and on the lab's MTU 9000 fabric tbf drops every full-size frame, so the link stalls in TCP
# retransmits (minutes for a few MiB) instead of running at the rate. 128 KiB holds 14 jumbo frames.
SLOW_LINK_TBF = ("burst", "128kb", "latency", "400ms")
# The fabric interface of a node whose inventory gives a fabric IP but no RDMA (the Station's TCP port on the
# Sparks' fabric): the inventory names no interface then, so the sim does (a generic Linux name).
PLAIN_FABRIC_IFACE = "eth1"
MTU_MISMATCH = 1500  # mtu-mismatch default: the Ethernet default, against the lab's jumbo 9000
DRIFTED_DRIVER = {"gb10": "580.82.07", "gb300": "590.44.01"}  # driver-drift default: another driver version
