"""Statement keys and roles: declared by each study beside its frozen criterion, carried by every committed claim.

Checked against the studies' own declarations (not against expected labels): every committed row of
docs/verdicts carries the key and role its study's ClaimSpec declares now and the hash of that study's criteria
(criteria unchanged by a relabelling); a test that is not primary in a study with primaries (unadjusted,
docs/evidence.md section 5) is never a counted test; malformed keys and roles are refused."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

import gapdyn
from gapdyn.evidence.claims import ROLES, STATEMENTS, keyed_specs, listing

ROOT = Path(__file__).resolve().parents[1]
STUDIES = {"length": "bandits.experiments.length", "logistic": "bandits.experiments.logistic",
           "methods": "bandits.experiments.methods", "stagnation": "bandits.experiments.stagnation",
           "stagnation_noisy": "bandits.experiments.stagnation_noisy",
           "success_rate": "bandits.experiments.success_rate", "taxonomy": "bandits.experiments.taxonomy",
           "threshold": "bandits.experiments.threshold", "llm-ablation": "llm_probe.experiments.ablation",
           "llm-wide": "llm_probe.experiments.ablation", "llm-early-warning": "llm_probe.experiments.early_warning",
           "llm-entropy-lemma": "llm_probe.experiments.entropy_lemma",
           "safe_step": "llm_probe.experiments.safe_step_experiment"}
"""Folder of docs/verdicts (without its mode) -> the module whose SPECS made it."""


def _module(name: str):
    return importlib.import_module(STUDIES[name])


def _spec_of(specs, cid: str):
    base = cid.split("@")[0]
    return specs[base] if base in specs else specs[base.split("/")[0]]


def test_every_committed_row_carries_its_study_declaration():
    folders = sorted((ROOT / "docs" / "verdicts").glob("*/claims.json"))
    assert {f.parent.name.removesuffix("-full") for f in folders} <= set(STUDIES)
    for f in folders:
        mod = _module(f.parent.name.removesuffix("-full"))
        hashes = {gapdyn.criteria_hash({k: s.criterion for k, s in mod.SPECS.items()}),
                  *getattr(mod, "EARLIER_CRITERIA_HASHES", ())}  # rows decided before a re-freeze of other claims
        for row in json.loads(f.read_text()):
            spec = _spec_of(mod.SPECS, row["id"])
            assert (tuple(row["key"]) if row["key"] else None) == spec.key and row["role"] == spec.role, row["id"]
            assert row["form"] == spec.form and row["criterion"] == spec.criterion.to_dict(), row["id"]
            assert row["criteria_hash"] in hashes, (f, row["id"])


@pytest.mark.parametrize("name", sorted(set(STUDIES) - {"llm-wide"}))
def test_a_refrozen_criterion_is_recorded_with_the_hash_it_replaced(name):
    """A re-freeze names the superseded criterion and the study's hash while it held: putting the old criterion
    back reproduces that hash (so the record is the criteria as they were), and no committed row still carries the
    superseded criterion (its rows were withdrawn, to be decided again by a run under the new one)."""
    mod = _module(name)
    refrozen = getattr(mod, "REFROZEN", {})
    assert set(getattr(mod, "EARLIER_CRITERIA_HASHES", ())) == {h for _, h, _ in refrozen.values()}
    for cid, (old, old_hash, why) in refrozen.items():
        assert old != mod.SPECS[cid].criterion and why, cid
        crit = {k: s.criterion for k, s in mod.SPECS.items()}
        crit.update({k: o for k, (o, h, _) in refrozen.items() if h == old_hash})
        assert gapdyn.criteria_hash(crit) == old_hash, cid
    for f in (ROOT / "docs" / "verdicts").glob(f"{name}-*/claims.json"):
        for row in json.loads(f.read_text()):
            if row["id"] in refrozen:
                assert row["criterion"] != refrozen[row["id"]][0].to_dict(), (f, row["id"])


@pytest.mark.parametrize("name", sorted(set(STUDIES) - {"llm-wide"}))
def test_declarations_use_registered_statements_and_untested_ones_say_why(name):
    specs = _module(name).SPECS
    for cid, spec in specs.items():
        assert spec.key is None or spec.key in STATEMENTS, cid
        assert spec.role in ROLES, cid
        if spec.role == "test" and spec.form in gapdyn.COUNTED_FORMS:
            assert spec.key is not None, f"{cid}: a counted test must name the statement it tests"
        if any(s.primary for s in specs.values()) and spec.criterion.alpha is not None and not spec.primary:
            assert spec.role != "test", f"{cid}: a test that is not primary is unadjusted, hence exploratory"


def test_every_registered_statement_is_tested_or_says_where_it_is_covered():
    used = {s.key for name in set(STUDIES) - {"llm-wide"} for s in _module(name).SPECS.values()}
    for key, st in STATEMENTS.items():
        assert key in used or st.note, f"{key}: no claim tests it and no note says why"


def _claim(**kw):
    crit = gapdyn.Criterion.above(0.0)
    return gapdyn.Claim(id="x", source="s", statement="s", setting="t", statistic="x", estimate=1.0,
                        interval=(0.5, 1.5), n=3, criterion_text=crit.describe(), criterion=crit, form="law", **kw)


def test_keys_and_roles_are_validated_and_survive_json():
    c = _claim(key=["Suk & Duan", "Theorem 2"], role="premise", block="confirmation")
    assert c.key == ("Suk & Duan", "Theorem 2")
    (back,) = gapdyn.claims_from_json(gapdyn.claims_to_json([c]))
    assert back == c and back.key == ("Suk & Duan", "Theorem 2")
    for bad in (("Suk & Duan", "Theorem 9"), "Suk & Duan: Theorem 2", ("Suk & Duan",), 5):
        with pytest.raises(ValueError, match="key must be None or a registered statement"):
            _claim(key=bad)
    with pytest.raises(ValueError, match="role must be one of"):
        _claim(role="primary")
    specs = {"a": gapdyn.ClaimSpec("s", "t", "law", gapdyn.Criterion.above(0.0))}
    assert keyed_specs(specs, {"a": (("WAPO", "stability"), "exploratory")})["a"].role == "exploratory"
    with pytest.raises(ValueError, match="keys must name the claims of specs"):
        keyed_specs(specs, {})
    with pytest.raises(ValueError, match="must be \\(statement key or None, role\\)"):
        keyed_specs(specs, {"a": ("WAPO", "stability", "test")})


def test_listing_by_hand():
    key = ("Suk & Duan", "Theorem 2")
    assert listing(_claim(key=key, block="confirmation")) == "counted"
    assert listing(_claim(key=key)) == "discovery only"
    assert listing(_claim(key=key), confirmation_only=False) == "counted"
    assert listing(_claim(key=key, role="premise", block="confirmation")) == "premise"
    assert listing(_claim(key=key, role="exploratory", block="confirmation")) == "exploratory"
    assert listing(_claim(block="confirmation")) == "exploratory"  # no statement named
    derived = gapdyn.Claim.from_dict({**_claim(key=key, block="confirmation").to_dict(), "form": "derived"} |
                                     {"verdict": "holds"})
    assert listing(derived) == "derived"
