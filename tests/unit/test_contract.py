"""The values other modules take from tracer.contract, derived from bpf/contract.toml."""

from __future__ import annotations

from tracer import contract
from tracer.model import benchresult
from tracer.pipeline import alerts
from tracer.views import compare, diff, plot


def test_derived_values_come_from_the_header():
    c = contract.load()
    assert c.ops == ["read", "write", "flush", "discard", "other"]
    assert c.phases == ["queue", "device", "total"]               # code order
    assert c.shown_phases == ["total", "queue", "device"]         # reports' order: the total first
    assert c.sector_size == 512
    assert "no_start" in c.drops and "inflight_full" in c.drops
    assert not any(r.startswith(("drop_", "note_")) or r == "merged" for r in c.drops)


def test_modules_use_the_contract_values():
    c = contract.load()
    assert alerts.OPS == plot.OPS == tuple(c.ops)
    assert alerts.PHASES == plot.PHASES == diff.PHASES == compare.SHOWN_PHASES == tuple(c.shown_phases)
    assert benchresult.PHASES == tuple(c.phases)
