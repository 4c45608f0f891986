"""The two bodies the Tinker SDK sends or wants as protobuf, not JSON: a `forward_backward` request in, and its
`ForwardBackwardOutput` and a sample's `SampleResponse` out (SDK 0.38 refuses JSON for those two). Decoded into and
built from the SDK's own types and generated messages (`tinker.proto.tinker_public_pb2`), so the wire stays the SDK's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.response_conv import _tensor_data_from_proto  # the SDK's inverse of its own request encoder

from hrl.runners.errors import ClientError

__all__ = ["Sequenced", "decode_forward_backward", "encode_forward_backward_output", "encode_sample_response"]

_DTYPES = {"float32": (pb.DTYPE_FLOAT32, np.float32), "int64": (pb.DTYPE_INT64, np.int64)}
_STOP = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


@dataclass(frozen=True)
class Sequenced:
    """One sampled sequence as the engine made it: its token ids, their logprobs and why it stopped."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"


def decode_forward_backward(body: bytes) -> tuple[types.ForwardBackwardRequest, bool]:
    """A `/api/v1/forward_backward` body as the SDK's request, and its `forward_only` flag. Raises ClientError 400
    for a body that is not the message, or holds what hrl does not train on (images, audio)."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:
        raise ClientError(400, f"forward_backward: the body is not a tinker ForwardBackwardRequest ({e})") from e
    data = [_datum(d, i) for i, d in enumerate(msg.data)]
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=msg.loss_fn,  # type: ignore[arg-type]
                                                          loss_fn_config=config or None),
        model_id=msg.model_id,
        seq_id=msg.seq_id,
    )  # fmt: skip
    return request, msg.forward_only


def _datum(msg: pb.Datum, index: int) -> types.Datum:
    tokens: list[int] = []
    for chunk in msg.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise ClientError(400, f"datum {index}: a {kind} chunk; hrl serve --tinker trains on token ids only")
        tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
    inputs = {name: _tensor_data_from_proto(t) for name, t in msg.loss_fn_inputs.items()}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def encode_forward_backward_output(outputs: Sequence[Mapping[str, np.ndarray]], metrics: Mapping[str, float]) -> bytes:
    """A `ForwardBackwardOutput`: one `ArrayRecord` holding, per field, every datum's 1-D array back to back."""
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(outputs))
    for name in outputs[0] if outputs else ():
        dtype = "int64" if np.issubdtype(outputs[0][name].dtype, np.integer) else "float32"
        code, np_type = _DTYPES[dtype]
        arrays = [np.ascontiguousarray(o[name], dtype=np_type).reshape(-1) for o in outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype=np.int64)
        record.fields[name].CopyFrom(pb.BatchedTensor(data=b"".join(a.tobytes() for a in arrays),
                                                      offsets=offsets.tobytes(), dtype=code))  # fmt: skip
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record])
    for k, v in metrics.items():
        out.metrics[k] = float(v)
    return bytes(out.SerializeToString())


def encode_sample_response(sequences: Sequence[Sequenced], prompt_logprobs: Sequence[float] | None = None) -> bytes:
    """A `SampleResponse`: each sequence's int32 token ids and float32 logprobs, and the prompt's (NaN: none)."""
    out = pb.SampleResponse()
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    for s in sequences:
        out.sequences.add(stop_reason=_STOP[s.stop_reason], tokens=np.asarray(s.tokens, dtype=np.int32).tobytes(),
                          logprobs=np.asarray(s.logprobs, dtype=np.float32).tobytes())  # fmt: skip
    return bytes(out.SerializeToString())
