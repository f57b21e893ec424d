"""`sparkfleet pin` without a lab: the node operation's parser (docker image inspect as the real CLI prints it),
the layer comparison and the verdict over the ranks, the profile edit that keeps every other byte, the loader's
rule that a pin follows its ref, and the command through a stand-in transport (the lab's run is test_pin_lab)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkfleet.checks.image import pin_verdict
from sparkfleet.cli.main import command_modules, main
from sparkfleet.fleet.ops.base import NodeError
from sparkfleet.fleet.ops.image import ImageBuild, InspectImage, same_build
from sparkfleet.fleet.transport import Result, RunEachByRun
from sparkfleet.opsdir import Spec
from sparkfleet.schema.errors import SpecError
from sparkfleet.schema.load import Loader
from sparkfleet.schema.pinedit import inheritors, set_image_digest

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

REF = "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2"
REPO = "aidendle94/sparkrun-vllm-dsv41-gb10"
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
L1, L2, L3 = ("sha256:" + c * 64 for c in "abc")
NODES = ("reddie", "asusi", "bluey", "spark4")


def inspect_json(*, digests: list[str], layers: list[str], image_id: str = "sha256:" + "9" * 64) -> str:
    """`docker image inspect REF` as docker 27 prints it (abridged to the fields read, plus some it ignores)."""
    return json.dumps([{"Id": image_id, "RepoTags": [REF], "RepoDigests": digests, "Parent": "",
                        "Created": "2026-11-20T10:00:00.000000000Z", "Architecture": "arm64", "Os": "linux",
                        "GraphDriver": {"Name": "vfs", "Data": None},
                        "RootFS": {"Type": "layers", "Layers": layers}}], indent=4)


def build(digests: tuple[str, ...] = (f"{REPO}@{D1}",), layers: tuple[str, ...] = (L1, L2),
          image_id: str = "sha256:" + "9" * 64) -> ImageBuild:
    return ImageBuild(id=image_id, repo_digests=digests, layers=layers)


# -- the node operation ---------------------------------------------------------------------------------------

def test_inspect_reads_digests_id_and_layers() -> None:
    op = InspectImage(REF)
    assert op.command() == f"docker image inspect {REF}"
    got = op.parse(Result("reddie", True, stdout=inspect_json(digests=[f"{REPO}@{D1}"], layers=[L1, L2]),
                          exit_code=0))
    assert got == ImageBuild(id="sha256:" + "9" * 64, repo_digests=(f"{REPO}@{D1}",), layers=(L1, L2))
    assert InspectImage("a b;rm -rf /").command() == "docker image inspect 'a b;rm -rf /'"


def test_inspect_a_missing_image_a_dead_daemon_and_a_silent_node() -> None:
    op = InspectImage(REF)
    missing = op.parse(Result("bluey", False, stdout="[]\n", stderr=f"Error: No such image: {REF}\n", exit_code=1,
                              error="exit"))
    assert isinstance(missing, NodeError) and missing.kind == "no-such-image"
    assert missing.message == f"{REF} is not on the node"
    down = op.parse(Result("bluey", False, stderr="Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
                           " Is the docker daemon running?\n", exit_code=1, error="exit"))
    assert isinstance(down, NodeError) and down.kind == "docker-down"
    gone = op.parse(Result("bluey", False, error="unreachable", message="bluey: connection refused"))
    assert isinstance(gone, NodeError) and gone.kind == "reach" and gone.message == "bluey: connection refused"


def test_inspect_without_layers_cannot_be_compared() -> None:
    got = InspectImage(REF).parse(Result("reddie", True, stdout=inspect_json(digests=[], layers=[]), exit_code=0))
    assert isinstance(got, NodeError) and "no RootFS.Layers" in got.message
    got = InspectImage(REF).parse(Result("reddie", True, stdout="not json", exit_code=0))
    assert isinstance(got, NodeError) and "did not print one image as JSON" in got.message


def test_the_same_build_is_the_same_layers_whatever_the_ids() -> None:
    assert same_build(build(image_id="sha256:" + "5" * 64), build(image_id="sha256:" + "6" * 64))
    assert not same_build(build(layers=(L1, L2)), build(layers=(L1, L3)))
    assert not same_build(build(layers=(L1, L2)), build(layers=(L2, L1)))  # order is content too
    assert build(layers=(L1, L2)).content == build(layers=(L1, L2), image_id="sha256:" + "7" * 64).content


# -- the verdict over the ranks -----------------------------------------------------------------------------------

def answers(*builds: ImageBuild | NodeError) -> list[tuple[int, str, ImageBuild | NodeError]]:
    return [(i, NODES[i], b) for i, b in enumerate(builds)]


def test_one_build_everywhere_pins_its_digest_ids_aside() -> None:
    v = pin_verdict(REF, answers(build(), build(image_id="sha256:" + "8" * 64), build(), build()))
    assert v.digest == D1 and v.reason == f"every rank holds {REF}@{D1}"
    assert [line.split(" (layers")[0] for line in v.lines] == [f"rank {i} ({n}): {D1}" for i, n in enumerate(NODES)]
    assert not [line for line in v.lines if "another build" in line]


def test_different_layers_are_refused_naming_every_rank_and_its_digest() -> None:
    other = build(digests=(f"{REPO}@{D2}",), layers=(L1, L3))
    v = pin_verdict(REF, answers(build(), build(), other, build()))
    assert v.digest is None
    assert v.reason == f"the ranks hold 2 different builds of {REF} (their layers differ)"
    assert v.lines[2] == (f"rank 2 (bluey): {D2} (layers {other.content[7:19]}, id 999999999999, another build than "
                          "rank 0's)")
    assert v.lines[0] == f"rank 0 (reddie): {D1} (layers {build().content[7:19]}, id 999999999999)"


def test_different_layers_under_one_digest_are_still_refused() -> None:
    """A digest is what the registry says; the layers are what the node holds: they decide."""
    v = pin_verdict(REF, answers(build(), build(layers=(L1, L3))))
    assert v.digest is None and "different builds" in v.reason


def test_a_missing_or_silent_node_is_refused_by_name() -> None:
    lost = NodeError("bluey", "no-such-image", f"{REF} is not on the node", "")
    v = pin_verdict(REF, answers(build(), build(), lost, build()))
    assert v.digest is None and v.reason == f"bluey did not show {REF}"
    assert v.lines[2] == f"rank 2 (bluey): {REF} is not on the node"


def test_no_digest_common_to_every_rank_is_refused() -> None:
    loaded = build(digests=())  # same layers, loaded locally: no registry digest
    v = pin_verdict(REF, answers(build(), loaded))
    assert v.digest is None and "no registry digest common" in v.reason
    assert v.lines[1].startswith("rank 1 (asusi): no repo digest (built or loaded locally) (layers ")
    v = pin_verdict(REF, answers(build(), build(digests=(f"{REPO}@{D2}",))))  # same layers, two manifests
    assert v.digest is None and "no registry digest common" in v.reason


def test_only_the_refs_own_repository_counts_docker_io_spelled_or_not() -> None:
    mirror = build(digests=(f"docker.io/{REPO}@{D1}", f"registry.lab:5000/{REPO}@{D2}"))
    v = pin_verdict(REF, answers(mirror, build(digests=(f"{REPO}@{D1}", f"{REPO}@{D2}"))))
    assert v.digest == D1
    v = pin_verdict(REF, answers(build(digests=(f"other/repo@{D1}",))))
    assert v.digest is None


# -- the profile edit ----------------------------------------------------------------------------------------------

def test_a_lane_inheriting_its_image_gets_an_image_block_appended() -> None:
    text = "# dcp2\nextends: production-1.2\ndcp: 2   # two\n"
    assert set_image_digest(text, D1, "profiles/dcp2.yaml") == text + f"image:\n  digest: {D1}\n"
    assert set_image_digest("extends: x\ndcp: 2", D1, "f") == f"extends: x\ndcp: 2\nimage:\n  digest: {D1}\n"


def test_a_digest_line_is_added_under_the_first_image_entry_comments_kept() -> None:
    text = "# head\nimage:\n    ref: a/b:c      # example\n    engine_version: \"1.0\"\nport: 1   # p\n"
    assert set_image_digest(text, D1, "f") == ("# head\nimage:\n    ref: a/b:c      # example\n"
                                               f"    digest: {D1}\n    engine_version: \"1.0\"\nport: 1   # p\n")
    crlf = "image:\r\n  ref: a/b:c\r\nport: 1\r\n"
    assert set_image_digest(crlf, D1, "f") == f"image:\r\n  ref: a/b:c\r\n  digest: {D1}\r\nport: 1\r\n"


def test_an_existing_digest_is_replaced_in_place() -> None:
    text = f'image:\n  ref: a/b:c\n  digest: "{D2}"  # the old build\nport: 1\n'
    assert set_image_digest(text, D1, "f") == f"image:\n  ref: a/b:c\n  digest: {D1}  # the old build\nport: 1\n"
    assert set_image_digest("image:\n  ref: a/b:c\n  digest: !unset\n", D1, "f") == \
        f"image:\n  ref: a/b:c\n  digest: {D1}\n"


@pytest.mark.parametrize("text", ["image: {ref: a/b:c}\n", "image: !unset\n", "image:\n  ref: >\n    a/b:c\n"])
def test_a_layout_the_edit_cannot_place_is_refused_with_the_line_to_add(text: str) -> None:
    with pytest.raises(SpecError) as exc:
        set_image_digest(text, D1, "profiles/x.yaml")
    assert str(exc.value).startswith("profiles/x.yaml:") and f"digest: {D1}" in str(exc.value)


def test_a_pin_follows_its_ref_through_extends(tmp_path: Path) -> None:
    """A lane extending a pinned one on the same image inherits the pin; one naming another image does not."""
    (tmp_path / "profiles").mkdir()
    base = "name: base\nengine: vllm\nimage:\n  ref: a/b:1\n  digest: " + D1 + "\n"
    (tmp_path / "profiles" / "base.yaml").write_text(base)
    (tmp_path / "profiles" / "same.yaml").write_text("extends: base\ntp: 2\n")
    (tmp_path / "profiles" / "other.yaml").write_text("extends: base\nimage:\n  ref: a/b:2\n")
    (tmp_path / "profiles" / "restated.yaml").write_text("extends: base\nimage:\n  ref: a/b:1\n")
    loader = Loader(tmp_path)
    assert loader.profile("same").profile.image.digest == D1
    assert loader.profile("restated").profile.image.digest == D1
    assert loader.profile("other").profile.image.digest is None
    new = set_image_digest(base, D2, "profiles/base.yaml")
    assert inheritors(tmp_path, "base", new, D2) == ["restated", "same"]
    assert (tmp_path / "profiles" / "base.yaml").read_text() == base  # read from a scratch copy


# -- the command, through a stand-in transport ------------------------------------------------------------------

class Fleet(RunEachByRun):
    """Answers `docker image inspect` per node from `images` (node -> stdout, or a failed Result)."""

    def __init__(self, images: dict[str, str | Result]) -> None:
        self.images = images
        self.commands: list[str] = []

    def run(self, nodes, command, *, stdin=None, timeout_s=60.0, env=None):  # noqa: ANN001
        self.commands.append(command)
        out = {}
        for n in nodes:
            got = self.images[n.name]
            out[n.name] = got if isinstance(got, Result) else Result(n.name, True, stdout=got, exit_code=0)
        return out

    def close(self) -> None:
        """Nothing to close."""


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch, ops_root: Path):
    command_modules()
    state: dict = {}
    monkeypatch.setattr("sparkfleet.fleet.connect.transport_for", lambda nodes: state["fleet"])
    return state


def pin(ops_root: Path, *extra: str) -> int:
    return main(["pin", "--profile", "dcp2", "--root", str(ops_root), "-i", "lab", *extra])


def test_the_command_writes_one_block_and_refuses_different_builds(fleet, ops_root: Path, capsys) -> None:
    path = ops_root / "profiles" / "dcp2.yaml"
    before = path.read_bytes()
    same = inspect_json(digests=[f"{REPO}@{D1}"], layers=[L1, L2])
    fleet["fleet"] = Fleet({n: same for n in NODES})
    assert pin(ops_root, "--dry-run=facts") == 0
    assert path.read_bytes() == before
    assert "would write profiles/dcp2.yaml:" in capsys.readouterr().out
    assert pin(ops_root) == 0
    assert path.read_bytes() == before + f"image:\n  digest: {D1}\n".encode()
    printed = capsys.readouterr().out
    assert f"  +  digest: {D1}" in printed and "also pinned (they extend dcp2 on the same image): dcp4" in printed
    assert Spec(ops_root).profile("dcp2").profile.image.digest == D1

    written = path.read_bytes()
    other = inspect_json(digests=[f"{REPO}@{D2}"], layers=[L1, L3], image_id="sha256:" + "4" * 64)
    fleet["fleet"] = Fleet({**{n: same for n in NODES}, "bluey": other})
    assert pin(ops_root) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"sparkfleet: pin refused: the ranks hold 2 different builds of {REF} (their layers differ); "
                      "nothing written")
    assert [line.split(" (layers")[0] for line in err[1:]] == [
        f"  rank {i} ({n}): {D2 if n == 'bluey' else D1}" for i, n in enumerate(NODES)]
    assert path.read_bytes() == written


def test_the_command_refuses_a_node_that_lacks_the_image(fleet, ops_root: Path, capsys) -> None:
    path = ops_root / "profiles" / "dcp2.yaml"
    before = path.read_bytes()
    same = inspect_json(digests=[f"{REPO}@{D1}"], layers=[L1, L2])
    fleet["fleet"] = Fleet({**{n: same for n in NODES}, "spark4": Result(
        "spark4", False, stdout="[]", stderr=f"Error: No such image: {REF}", exit_code=1, error="exit")})
    assert pin(ops_root, "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["refused"] == f"spark4 did not show {REF}" and doc["written"] is False
    assert doc["ranks"][3] == {"rank": 3, "node": "spark4", "error": f"{REF} is not on the node"}
    assert path.read_bytes() == before


def test_a_lane_without_an_image_is_bad_input(ops_root: Path, capsys) -> None:
    assert main(["pin", "--profile", "llamacpp-sparks", "--root", str(ops_root), "-i", "lab"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "sparkfleet: profiles/llamacpp-sparks.yaml: profile 'llamacpp-sparks' names no image (image.ref): nothing to pin"]


def test_a_profile_the_edit_cannot_place_is_refused_before_any_node_is_asked(fleet, ops_root: Path, capsys) -> None:
    path = ops_root / "profiles" / "dcp2.yaml"
    path.write_text(path.read_text() + "image: {ref: " + REF + "}\n")
    before = path.read_bytes()
    fleet["fleet"] = Fleet({})
    assert pin(ops_root) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("sparkfleet: profiles/dcp2.yaml:") and "not a block mapping" in err[0]
    assert fleet["fleet"].commands == [] and path.read_bytes() == before
