"""The suite neither depends on nor writes into the real user's home (conftest `_own_home`, tests/realhome.py):
it runs with a HOME of its own, local nodes' `~` is that one, the build caches made before pytest runs are
still found in the real home, and the session's closing check of the real home's sparkfleet dirs fails when
anything there changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkfleet.fleet.local import LocalTransport
from sparkfleet.fleet.ops.helper import guard_command, helper_bytes, remote_path
from sparkfleet.sim import llamabuild
from sparkfleet.userconfig import config_path, setting
from tests import realhome
from tests.test_transport_local import make_node

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


def test_the_suite_has_a_home_of_its_own(tmp_path_factory) -> None:
    home = Path(os.environ["HOME"])
    assert home != realhome.REAL_HOME and Path.home() == home == Path(os.path.expanduser("~"))
    assert home.is_relative_to(tmp_path_factory.getbasetemp())
    assert not any(v in os.environ for v in realhome.XDG_BASES)
    # what sparkfleet reads from a home is read from this one (unless the caller named a file of its own)
    if not os.environ.get("SPARKFLEET_CONFIG"):
        assert config_path() == home / ".config/sparkfleet/config.yaml"
    if not os.environ.get("SPARKFLEET_SSH_CONFIG"):
        assert setting("ssh_config").value == str(home / ".ssh/config")


def test_the_build_caches_stay_the_real_users() -> None:
    """`make llama-rpc` filled the real home's cache before pytest ran: the suite still finds it there."""
    caches = realhome.build_caches()
    for var, path in caches.items():
        assert os.environ[var] == str(path)
        assert path == (Path(realhome.REAL_ENV[var]) if realhome.REAL_ENV.get(var) else realhome.BUILD_CACHES[var])
    assert llamabuild.cache_dir().parent == caches["SPARKFLEET_LLAMA_CACHE"]


def test_a_plain_local_node_ships_into_the_suites_home() -> None:
    """The node the issue was about: a local node's `~` (its commands' $HOME, the helper guard's expanduser, a
    put to ~/...) is the suite's home, so the facts helper is shipped and found there, and a copy in the real
    home is neither used nor made."""
    node, home = make_node("here"), Path(os.environ["HOME"])
    where = "import os; print(os.path.expanduser('~/.cache/sparkfleet/bin'))"
    before = realhome.snapshot(realhome.watched(), skip=list(realhome.build_caches().values()))
    with LocalTransport() as t:
        assert t.run([node], f'printf %s "$HOME"; echo; python3 -c "{where}"')["here"].stdout.splitlines() == [
            str(home), str(home / ".cache/sparkfleet/bin")]
        assert t.put([node], helper_bytes("facts.py"), remote_path("facts.py"), mode=0o755)["here"].ok
        assert t.run([node], guard_command("facts.py", run=False))["here"].ok  # the guard finds it there
    assert (home / ".cache/sparkfleet/bin/facts.py").read_bytes() == helper_bytes("facts.py")
    assert realhome.changes(before, realhome.snapshot(realhome.watched(),
                                                      skip=list(realhome.build_caches().values()))) == []


def test_the_closing_check_sees_what_changed(tmp_path: Path) -> None:
    """The session's check of the real home can fail: run on a stand-in home, it names an entry added, changed
    or removed anywhere below sparkfleet's dirs, and nothing the build caches hold."""
    home = tmp_path / "home"
    watched = realhome.watched(home, {})
    caches = [home / ".cache/sparkfleet/llama.cpp"]
    assert home / ".cache/sparkfleet" in watched and home / ".local/state/sparkfleet" in watched
    assert home / ".config/sparkfleet" in watched
    (home / ".config/sparkfleet").mkdir(parents=True)
    (home / ".config/sparkfleet/config.yaml").write_text("inventory: lab\n")
    (home / ".local/state/sparkfleet/runs").mkdir(parents=True)
    before = realhome.snapshot(watched, caches)
    assert realhome.changes(before, realhome.snapshot(watched, caches)) == []
    (home / ".cache/sparkfleet/llama.cpp/11434.0.0-key/bin").mkdir(parents=True)  # a build meanwhile: not ours
    assert realhome.changes(before, realhome.snapshot(watched, caches)) == []
    (home / ".cache/sparkfleet/bin").mkdir()
    (home / ".cache/sparkfleet/bin/facts.py").write_text("shipped\n")
    (home / ".config/sparkfleet/config.yaml").write_text("inventory: simulated\n")  # a size of its own: mtimes may tie
    (home / ".local/state/sparkfleet/runs").rmdir()
    assert realhome.changes(before, realhome.snapshot(watched, caches)) == [
        f"added {home}/.cache/sparkfleet/bin", f"added {home}/.cache/sparkfleet/bin/facts.py",
        f"removed {home}/.local/state/sparkfleet/runs", f"changed {home}/.config/sparkfleet/config.yaml"]
    # the XDG variables move the dirs: those are watched too
    assert Path("/elsewhere/state/sparkfleet") in realhome.watched(home, {"XDG_STATE_HOME": "/elsewhere/state"})
