"""Answers that do not depend on the order of the labels (issue 58): ``label_orders=k`` equals the slow, obvious
computation (each order extracted alone, the distributions put back in schema order and averaged), its orders share
their passes, the collector gives the same answer, a schema and its reverse get the same answer with two orders,
and what it cannot do is refused."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_engine import Head, compile_schema
from pcd_engine.errors import OptionError
from pcd_engine.run.orders import label_orders, reordered

SCHEMA = {
    "tone": {"type": "enum", "choices": ["calm", "angry", "sad", "tired"]},
    "refund": {"type": "boolean"},
    "tags": {"type": "multi", "choices": ["late", "broken"]},
    "note": {"type": "string", "max_tokens": 2},
}
TEXTS = ["I am furious, the parcel is late!", "Thanks, all is fine.", "So tired of waiting for the refund."]


def test_the_orders_are_the_schemas_own_its_reverse_then_shifts():
    assert label_orders(4) == [(False, 0), (True, 0), (False, 1), (True, 1)]
    schema = compile_schema(SCHEMA)
    assert reordered(schema, (False, 0)) is schema
    back = reordered(schema, (True, 0))
    assert back.field("tone").values == ("tired", "sad", "angry", "calm")
    assert back.field("refund").values == tuple(reversed(schema.field("refund").values))
    assert back.field("tags").values == ("late", "broken")  # multi-label fields keep their order
    assert reordered(schema, (False, 1)).field("tone").values == ("angry", "sad", "tired", "calm")
    assert back.fingerprint != schema.fingerprint


def slow_mean(engine, text, count, **options):
    """Each order extracted alone, its distribution put back in schema order, averaged."""
    schema = compile_schema(SCHEMA)
    rows = []
    for order in label_orders(count):
        variant = reordered(schema, order)
        f = engine.extract(text, variant, **options).fields["tone"]
        at = dict(zip(variant.field("tone").values, f.label_distribution, strict=True))
        rows.append([at[v] for v in schema.field("tone").values])
    return np.mean(rows, axis=0)


@pytest.mark.parametrize("count", [2, 3])
def test_label_orders_equal_each_order_alone_averaged(tiny_engine, count):
    got = tiny_engine.extract_many(TEXTS, SCHEMA, label_orders=count)
    for text, out in zip(TEXTS, got, strict=True):
        want = slow_mean(tiny_engine, text, count)
        tone = out.fields["tone"]
        np.testing.assert_allclose(tone.label_distribution, want, atol=1e-5)
        assert tone.value == ("calm", "angry", "sad", "tired")[int(np.argmax(want))]
        assert tone.probability == pytest.approx(max(want), abs=1e-5)
        assert out.values["tone"] == tone.value and set(out.values) == set(SCHEMA)
    alone = tiny_engine.extract(TEXTS[0], SCHEMA, label_orders=count)
    np.testing.assert_allclose(alone.fields["tone"].label_distribution, got[0].fields["tone"].label_distribution,
                               atol=1e-5)  # fmt: skip


def test_the_orders_share_their_passes_and_the_collector_agrees(tiny_engine):
    out = tiny_engine.extract(TEXTS[0], SCHEMA, label_orders=2)
    assert max(out.stats.documents_per_pass) >= 2  # both orders in one scoring pass
    via = tiny_engine.collector().submit(TEXTS[0], SCHEMA, label_orders=2).result()
    np.testing.assert_allclose(via.fields["tone"].label_distribution, out.fields["tone"].label_distribution, atol=1e-5)


def test_a_schema_and_its_reverse_answer_alike_with_two_orders(tiny_engine):
    """Its own order and the reverse are the same two orders: the answers cannot flip."""
    schema = compile_schema(SCHEMA)
    back = reordered(schema, (True, 0))
    for text in TEXTS:
        one = tiny_engine.extract(text, schema, label_orders=2).fields["tone"]
        other = tiny_engine.extract(text, back, label_orders=2).fields["tone"]
        assert one.value == other.value
        at = dict(zip(back.field("tone").values, other.label_distribution, strict=True))
        np.testing.assert_allclose(one.label_distribution, [at[v] for v in schema.field("tone").values], atol=1e-5)


def test_abstaining_is_on_the_mean_and_what_cannot_be_averaged_is_refused(tiny_engine):
    out = tiny_engine.extract(TEXTS[0], SCHEMA, label_orders=2, min_probability=1.0)
    assert out.fields["tone"].abstained and sum("below min_probability" in w for w in out.warnings) >= 1
    with pytest.raises(OptionError, match="label_orders: expected at most 8 orders, but got 9"):
        tiny_engine.extract(TEXTS[0], SCHEMA, label_orders=9)
    with pytest.raises(OptionError, match="label_orders"):
        tiny_engine.extract(TEXTS[0], SCHEMA, label_orders=0)
    head = Head.fit(tiny_engine, SCHEMA, [(t, {"tone": v}) for t, v in zip(TEXTS, ["angry", "calm", "tired"],
                                                                            strict=True)])  # fmt: skip
    with pytest.raises(OptionError, match="expected no head or calibration"):
        tiny_engine.extract(TEXTS[0], SCHEMA, label_orders=2, head=head)


def test_pcd_run_takes_label_orders(capsys, tiny_folder, tmp_path):
    import json

    from pcd_engine.tools.cli import main

    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    code = main(["run", tiny_folder, "--schema", str(schema), "--text", TEXTS[0], "--label-orders", "2", "--json",
                 "-q"])  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)["values"]["tone"] in SCHEMA["tone"]["choices"]
    assert main(["run", tiny_folder, "--schema", str(schema), "--text", "x", "--label-orders", "9", "-q"]) == 1
    assert "label_orders: expected at most 8 orders" in capsys.readouterr().err
