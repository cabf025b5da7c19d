"""A draft head that does not fit the model a load names never stops the load: where the head's own file says whom it
was made for (its width against the model's header), that is told before the model is read; where only the weights
tell (the fingerprint), after. Either way the model loads without the head and `Loaded` says why in one line."""

from __future__ import annotations

import json

import pytest

from specula.engine.api.types import LoadRequest, ModelChoice
from specula.engine.heads.made_for import unfit_before_loading
from specula.engine.serving.session import Session
from tests.support.tiny import loaded, random_medusa_head, tiny_model


@pytest.fixture(scope="module")
def wide_head(tmp_path_factory):
    """A Medusa head made for a tiny model 64 wide (the tiny folder's model is 32 wide)."""
    return random_medusa_head(loaded(tiny_model(vocab=64, layers=2, seed=3)), tmp_path_factory.mktemp("wide") / "head")


def test_a_head_of_another_width_is_told_from_the_files_alone(wide_head, tiny_folder, tmp_path):
    why = unfit_before_loading(str(wide_head), ModelChoice(str(tiny_folder)))
    assert why == f"the draft head in {wide_head} was made for tiny (64 wide), not {tiny_folder.name} (32 wide)"
    bundled = unfit_before_loading(str(wide_head), ModelChoice("bundled"))  # a GGUF's header: 576 wide
    assert bundled is not None and "not SmolLM2-135M-Instruct" in bundled and "(576 wide)" in bundled
    published = tmp_path / "published"  # a published EAGLE head's config.json names its target's size
    published.mkdir()
    (published / "config.json").write_text(json.dumps({"hidden_size": 4096, "base_model_name_or_path": "big/model"}))
    assert "made for big/model (4096 wide)" in unfit_before_loading(str(published), ModelChoice(str(tiny_folder)))
    # what the files do not say is left to the load: no head file, a Hub model not in the cache, the same width
    assert unfit_before_loading(str(tmp_path / "missing"), ModelChoice(str(tiny_folder))) is None
    assert unfit_before_loading(str(wide_head), ModelChoice("nobody/not-cached")) is None
    (published / "config.json").write_text(json.dumps({"hidden_size": 32}))
    assert unfit_before_loading(str(published), ModelChoice(str(tiny_folder))) is None


def test_a_load_leaves_out_a_head_of_another_width_without_reading_it(wide_head, tiny_folder, monkeypatch):
    session = Session()

    def never(*args, **kwargs):
        raise AssertionError("the head was read")

    monkeypatch.setattr(session, "add_head", never)
    spec = ModelChoice(str(tiny_folder), "cpu", "fp32")
    out = session.load(LoadRequest(spec, measure_baseline=False, draft_head=str(wide_head)))
    assert out.target == tiny_folder.name and session.target is not None  # the model is loaded
    assert out.dropped_head == str(wide_head) and "medusa" not in out.strategies
    assert out.dropped_why.endswith("(32 wide): the model loaded without it") and "\n" not in out.dropped_why
    assert out.dropped_why not in out.warnings  # said once, by its own field


def test_a_head_for_other_weights_of_the_same_width_is_left_out_once_the_model_is_read(tiny_folder, tmp_path):
    session = Session()
    spec = ModelChoice(str(tiny_folder), "cpu", "fp32")
    session.load(LoadRequest(spec, measure_baseline=False))
    head = random_medusa_head(session.target, tmp_path / "head")
    info = json.loads((head / "head.json").read_text())
    (head / "head.json").write_text(json.dumps({**info, "target": "0" * 16, "target_name": "another"}))
    assert unfit_before_loading(str(head), spec) is None  # the same width: only the weights tell
    out = session.load(LoadRequest(spec, measure_baseline=False, draft_head=str(head)))
    assert out.dropped_head == str(head) and "medusa" not in out.strategies
    assert out.dropped_why == (f"the draft head in {head} was trained for another model (made for another), not "
                               f"{tiny_folder.name}: the model loaded without it")
    (head / "head.json").write_text(json.dumps(info))  # made for it: used, and nothing is said
    out = session.load(LoadRequest(spec, measure_baseline=False, draft_head=str(head)))
    assert "medusa" in out.strategies and out.dropped_head == out.dropped_why == ""
