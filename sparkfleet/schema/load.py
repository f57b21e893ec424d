"""Loading the spec from an ops directory: inventory, profiles (with `extends`) and playbooks."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparkfleet.schema.base import validate
from sparkfleet.schema.errors import SpecError
from sparkfleet.schema.inventory import Inventory
from sparkfleet.schema.merge import deep_merge, strip_unset
from sparkfleet.schema.overrides import Override
from sparkfleet.schema.overrides import apply as apply_overrides
from sparkfleet.schema.playbook import Playbook
from sparkfleet.schema.profile import Profile
from sparkfleet.schema.yamlsrc import Marks, load_yaml, locate


@dataclass
class Loaded:
    """A profile plus where each of its keys came from (for error messages and `show`)."""

    profile: Profile
    marks: Marks
    chain: list[str] = field(default_factory=list)  # files, base first
    overrides: list[Override] = field(default_factory=list)  # -o KEY=VALUE, applied after extends


@dataclass(frozen=True)
class Hooks:
    """What loading needs from above the schema, passed in: the schema imports no engine, sim or transport
    (sparkfleet/opsdir.py wires them)."""

    sim_inventory: Callable[[], Path] | None = None  # where the simulated lab wrote its inventory
    resolve_ssh: Callable[[Inventory, Marks, str], Inventory] | None = None  # the operator's ~/.ssh/config
    check_lane: Callable[[Loaded], None] | None = None  # the engine adapter's own checks (raises SpecError)
    default_inventory: Callable[[], str | None] | None = None  # SPARKFLEET_INVENTORY, the config file


def _pin_follows_ref(base: dict, over: dict, merged: dict, marks: Marks) -> None:
    """A digest pins its own ref: a lane naming another image (image.ref) with no digest of its own does not
    inherit the base's pin of the base's image (`extends` merges `image` key by key), which would fail every
    rank of it. `sparkfleet pin` writes a lane's pin into the lane's own file, which other lanes extend."""
    own, was, now = over.get("image"), base.get("image"), merged.get("image")
    if isinstance(own, dict) and isinstance(was, dict) and isinstance(now, dict) and "ref" in own \
            and "digest" not in own and own["ref"] != was.get("ref"):
        now.pop("digest", None)
        marks.pop(("image", "digest"), None)


class Loader:
    """Reads YAML from one ops directory; every method raises SpecError on bad input."""

    def __init__(self, root: Path, hooks: Hooks | None = None):
        self.root = root
        self.hooks = hooks or Hooks()

    def _rel(self, path: Path) -> str:
        try:
            return str(path.resolve().relative_to(self.root))
        except ValueError:
            return str(path)

    # -- inventory ---------------------------------------------------------------------
    def inventory_path(self, name: str) -> Path:
        p = Path(name)
        if p.suffix in (".yaml", ".yml") or "/" in name:
            return p
        own = self.root / "inventories" / f"{name}.yaml"
        if name == "sim" and not own.is_file() and self.hooks.sim_inventory is not None:
            path = self.hooks.sim_inventory()  # the simulated lab writes its own
            if not path.is_file():
                raise SpecError("no simulated lab is up: run `sparkfleet sim up` first", str(path))
            return path
        return own

    def inventory(self, name: str | None = None) -> Inventory:
        """The named inventory; None = the user's default (SPARKFLEET_INVENTORY, config file, else `lab`)."""
        if name is None:
            name = (self.hooks.default_inventory() if self.hooks.default_inventory else None) or "lab"
        path = self.inventory_path(name)
        display = self._rel(path)
        if not path.is_file():
            known = sorted(p.stem for p in (self.root / "inventories").glob("*.yaml"))
            raise SpecError(f"no such inventory (known: {', '.join(known) or 'none'})", display)
        data, marks = load_yaml(path, display)
        if not isinstance(data, dict):
            raise SpecError("expected a mapping with nodes: and groups:", display, 1)
        data.setdefault("name", path.stem)
        inv = validate(Inventory, strip_unset(data), marks, display)
        for group, members in inv.groups.items():
            _, line = locate(marks, ("groups", group))
            if not members:
                raise SpecError("group has no nodes", display, line, f"groups.{group}")
            for i, member in enumerate(members):
                if member not in inv.nodes:
                    _, mline = locate(marks, ("groups", group, i))
                    raise SpecError(f"names node {member!r}, which is not under nodes: "
                                    f"(known: {', '.join(inv.nodes)})", display, mline, f"groups.{group}")
        for key, node in inv.nodes.items():
            if node.name != key:
                _, line = locate(marks, ("nodes", key, "name"))
                raise SpecError(f"name {node.name!r} differs from its key {key!r}", display, line,
                                f"nodes.{key}.name")
        if inv.fabric_subnet:
            net = ipaddress.ip_network(inv.fabric_subnet)
            for key, node in inv.nodes.items():
                if node.fabric_ip and ipaddress.ip_address(node.fabric_ip) not in net:
                    _, line = locate(marks, ("nodes", key, "fabric_ip"))
                    raise SpecError(f"{node.fabric_ip} is outside fabric_subnet {net}", display, line,
                                    f"nodes.{key}.fabric_ip")
        return self.hooks.resolve_ssh(inv, marks, display) if self.hooks.resolve_ssh else inv

    # -- profiles ----------------------------------------------------------------------
    def profile_names(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "profiles").glob("*.yaml"))

    def _raw_profile(self, name: str, chain: list[str]) -> tuple[dict, Marks, list[str]]:
        if "/" in name or "\\" in name or name.startswith(".") or name.endswith((".yaml", ".yml")):
            # a name under profiles/, never a path: `../inventories/lab` would read an inventory as a lane
            raise SpecError(f"{name!r} is not a profile name: a profile is named by its file under profiles/ "
                            "without .yaml (see `sparkfleet profiles`)", chain[-1] if chain else None)
        path = self.root / "profiles" / f"{name}.yaml"
        display = self._rel(path)
        if not path.is_file():
            known = ", ".join(n for n in self.profile_names() if not n.startswith("_"))
            raise SpecError(f"no profile named {name!r} (known: {known})", chain[-1] if chain else None)
        if display in chain:
            raise SpecError("extends cycle: " + " -> ".join(chain + [display]), display)
        data, marks = load_yaml(path, display)
        if not isinstance(data, dict):
            raise SpecError("a profile is a mapping of fields", display, 1)
        base_name = data.get("extends")
        if base_name is None:
            return data, marks, [display]
        if not isinstance(base_name, str):
            _, line = locate(marks, ("extends",))
            raise SpecError("expected the name of another profile", display, line, "extends")
        try:
            base, base_marks, files = self._raw_profile(base_name, chain + [display])
        except SpecError as exc:
            if exc.file is None or (exc.message.startswith("no profile named") and exc.file == display):
                _, line = locate(marks, ("extends",))
                raise SpecError(exc.message, display, line, "extends") from None
            raise
        base = {k: v for k, v in base.items() if k not in ("abstract", "description")}
        merged = deep_merge(base, data, base_marks, marks)
        _pin_follows_ref(base, data, merged, base_marks)
        return merged, base_marks, files + [display]

    def profile(self, name: str, overrides: list[Override] | None = None) -> Loaded:
        """The merged profile; `overrides` (-o KEY=VALUE) are set after `extends`, then all is validated."""
        data, marks, files = self._raw_profile(name, [])
        data = strip_unset(data)
        if overrides:
            apply_overrides(data, overrides, marks, Profile)
        data["name"] = name
        marks[()] = (files[-1], 1)
        profile = validate(Profile, data, marks, files[-1])
        loaded = Loaded(profile, marks, files, list(overrides or []))
        if self.hooks.check_lane is not None and not profile.abstract:
            self.hooks.check_lane(loaded)
        return loaded

    # -- playbooks ---------------------------------------------------------------------
    def playbook(self, name_or_path: str) -> Playbook:
        p = Path(name_or_path)
        path = p if (p.suffix in (".yaml", ".yml") or "/" in name_or_path) else (
            self.root / "playbooks" / f"{name_or_path}.yaml")
        display = self._rel(path)
        data, marks = load_yaml(path, display)
        if not isinstance(data, dict):
            raise SpecError("a playbook is a mapping with steps:", display, 1)
        data.setdefault("name", path.stem)
        return validate(Playbook, data, marks, display)
