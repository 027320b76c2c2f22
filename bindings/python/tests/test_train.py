"""Training drafters through Registry.train_drafter: refusals of drafters with nothing to train
and of bad arguments, and, with the train-probe plugin (bindings/testdata), the parameters and
progress reports that cross the C ABI and cancelling from the callback."""
import pytest

import specinfer
from specinfer import Code, SpecinferError, TrainProgress

from conftest import Lookup, corpus, generate, kgram


@pytest.mark.parametrize("plugin", ["ngram", "kgram", "lookup-py"])
def test_drafters_with_nothing_to_train_are_unsupported(registry, tmp_path, plugin):
    registry.register_drafter("lookup-py", lambda cfg, info: Lookup())
    target = kgram(registry, 4)
    out = tmp_path / "heads.gguf"
    called = []
    with pytest.raises(SpecinferError) as e:
        registry.train_drafter(plugin, target, out, [corpus()], progress=called.append)
    assert e.value.code == Code.UNSUPPORTED
    assert f"'{plugin}' has nothing to train" in e.value.message
    assert not called and not out.exists()
    # The target is still usable afterwards.
    assert generate(target, max_tokens=20)[0]


def test_bad_training_arguments_are_errors(registry, tmp_path):
    target = kgram(registry, 4)
    out = tmp_path / "heads.gguf"

    def check(code, part, *args, **kwargs):
        with pytest.raises(SpecinferError) as e:
            registry.train_drafter(*args, **kwargs)
        assert e.value.code == code and part in e.value.message, e.value

    check(Code.INVALID_ARGUMENT, "out_path", "ngram", target, "", [corpus()])
    check(Code.NOT_FOUND, "no-such-plugin", "no-such-plugin", target, out, [corpus()])
    check(Code.NOT_FOUND, "no drafter", "gguf", target, out, [corpus()])
    check(Code.INVALID_ARGUMENT, "NUL", "ng\0ram", target, out)
    check(Code.INVALID_ARGUMENT, "NUL", "ngram", target, out, config="a\0b")
    check(Code.INVALID_ARGUMENT, "NUL", "ngram", target, out, ["a\0b"])
    check(Code.INVALID_ARGUMENT, "NUL", "ngram", target, "a\0b")
    with pytest.raises(TypeError):
        registry.train_drafter("ngram", target, out, [42])
    # A target that a session uses is not the trainer's.
    s = specinfer.Session(target)
    check(Code.STATE, "session", "ngram", target, out, [corpus()])
    s.close()
    target.close()
    check(Code.INVALID_ARGUMENT, "closed", "ngram", target, out, [corpus()])


def test_training_progress_and_parameters_cross_the_abi(registry, tmp_path, train_probe_plugin):
    registry.load_plugin(train_probe_plugin)
    target = kgram(registry, 4)
    out = tmp_path / "heads.gguf"

    # Every report arrives, in order, with its fields; then the parameters are written down.
    seen = []
    registry.train_drafter("train-probe", target, out, ["/data/a.txt", "/data/b b.txt"], config="heads=2,epochs=1",
                           progress=seen.append)
    assert seen == [TrainProgress("collect", 0, 2, None, None), TrainProgress("collect", 1, 2, None, None),
                    TrainProgress("collect", 2, 2, None, None), TrainProgress("train", 1, 2, 2.5, None),
                    TrainProgress("train", 2, 2, 1.5, None), TrainProgress("evaluate", 1, 1, 1.5, [0.5, 0.25])]
    assert out.read_text() == "config=heads=2,epochs=1\ncorpus=2\n/data/a.txt\n/data/b b.txt\n"

    # No callback, no config, no corpus: the plugin gets NULLs and zero; one path is a corpus.
    registry.train_drafter("train-probe", target, str(out))
    assert out.read_text() == "config=(null)\ncorpus=0\n"
    registry.train_drafter("train-probe", target, out, corpus())
    assert out.read_text() == f"config=(null)\ncorpus=1\n{corpus()}\n"

    # Returning False cancels at once.
    out.unlink()
    calls = []

    def stop_in_training(p):
        calls.append(p)
        return p.stage != "train"

    with pytest.raises(SpecinferError) as e:
        registry.train_drafter("train-probe", target, out, [corpus()], progress=stop_in_training)
    assert e.value.code == Code.CANCELLED
    assert "train-probe: cancelled during train 1" in e.value.message
    assert len(calls) == 4 and not out.exists()

    # The plugin's own refusal comes back with its code and message.
    with pytest.raises(SpecinferError) as e:
        registry.train_drafter("train-probe", target, out, config="fail=1")
    assert e.value.code == Code.CONFIG and "train-probe: asked to fail" in e.value.message

    # An exception in the callback stops the training and is re-raised here.
    with pytest.raises(ZeroDivisionError):
        registry.train_drafter("train-probe", target, out, progress=lambda p: 1 / 0)
    assert not out.exists()
