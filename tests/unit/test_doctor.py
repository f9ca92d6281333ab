"""`tandem doctor`'s fact collection on this machine."""

from __future__ import annotations

from backends import select


def test_doctor_collects_without_failing():
    from app.commands.doctor import collect

    facts = collect()
    assert facts["backend"] in select.BACKENDS
    assert facts["reason"]
