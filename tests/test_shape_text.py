"""--input-shape spellings: onnxfuse's, onnxsim's/onnxslim's and Polygraphy's (onnxfuse/model/shape_text.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from onnxfuse.cli.main import main
from onnxfuse.errors import InputError
from onnxfuse.model.shape_text import parse_input_shape


@pytest.mark.parametrize("text, expected", [
    ("x=1x3x640x640", ("x", (1, 3, 640, 640))),
    ("x:1,3,640,640", ("x", (1, 3, 640, 640))),  # onnxsim --overwrite-input-shape, onnxslim --input-shapes
    ("x:[1,3,640,640]", ("x", (1, 3, 640, 640))),  # Polygraphy --input-shapes
    ("x:[1, 3, 640, 640]", ("x", (1, 3, 640, 640))),
    ("input:0:1,224,224,3", ("input:0", (1, 224, 224, 3))),  # a TensorFlow tensor name
    ("input:0=1x224x224x3", ("input:0", (1, 224, 224, 3))),
    ("sr=", ("sr", ())),
    ("sr:[]", ("sr", ())),
])
def test_spellings(text, expected):
    assert parse_input_shape(text) == expected


@pytest.mark.parametrize("text, message", [
    ("1x3x8x8", "expected a graph input name and its dims"),
    ("x=1x3xHx8", "dims must be integers separated by 'x' or ','"),
    ("x:[1,3,,8]", "dims must be integers"),
    ("x=0x3", "dims must be between 1 and"),
    ("x=-1x3", "dims must be integers"),
])
def test_malformed_values_name_every_spelling(text, message):
    with pytest.raises(InputError, match=message) as info:
        parse_input_shape(text)
    assert "\n" not in str(info.value)


def test_cli_takes_the_peers_spelling(tmp_path):
    from tests.builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("image", ["N", 3, 8, 8])
    model = b.build(b.op("Relu", [b.conv(x, 3, 4)]))
    import onnx

    onnx.save(model, str(tmp_path / "m.onnx"))
    for spelling in ("image=2x3x8x8", "image:2,3,8,8", "image:[2,3,8,8]"):
        result = CliRunner().invoke(main, ["report", str(tmp_path / "m.onnx"), "--input-shape", spelling,
                                           "--format", "json"])
        assert result.exit_code == 0, result.output
        assert '"image": [\n      2,\n      3,\n      8,\n      8\n    ]' in result.output
