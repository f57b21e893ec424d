"""The ops directory as sparkfleet reads it: the schema's loader (sparkfleet/schema, which imports none of
this) with what loading needs from above it wired in: the engine adapters' lane checks, where the simulated
lab wrote its inventory, the operator's ~/.ssh/config and default inventory."""

from __future__ import annotations

from pathlib import Path

from sparkfleet.engines.registry import check_lane
from sparkfleet.root import sim_inventory_path
from sparkfleet.schema.inventory import Inventory
from sparkfleet.schema.load import Hooks, Loaded, Loader
from sparkfleet.schema.yamlsrc import Marks
from sparkfleet.userconfig import value

__all__ = ["Loaded", "Spec"]


def _sim_inventory() -> Path:
    return sim_inventory_path()


def _resolve_ssh(inv: Inventory, marks: Marks, display: str) -> Inventory:
    from sparkfleet.fleet.sshconfig import resolve  # as ssh reads it: HostName, User, Port, IdentityFile, ProxyJump

    return resolve(inv, marks, display)


def _check_lane(loaded: Loaded) -> None:
    check_lane(loaded)


def _default_inventory() -> str | None:
    return value("inventory")


HOOKS = Hooks(sim_inventory=_sim_inventory, resolve_ssh=_resolve_ssh, check_lane=_check_lane,
              default_inventory=_default_inventory)


class Spec(Loader):
    """One ops directory (profiles, inventories, playbooks, templates, patches), read with every check."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, HOOKS)
