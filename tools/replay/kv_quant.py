"""--kv_dtype=fp8_e4m3: the replay's one place that turns K/V into float8_e4m3fn.

Scales are per kv head, from the data: amax / 448 (448 is e4m3's largest finite value) of
a calibration sample the token source draws before any token is written, as a server
calibrates its KV scales on sample data. A later value beyond the sample's amax is
saturated to +-448 (counted, and shown in the summary); splitkv then reads
stored * scale, which is what the float64 checks compare against (dequantize()).
"""

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
CALIBRATION_TOKENS = 4096


class Fp8KvQuantizer:
    """Per-kv-head scales and the quantization of K/V tokens.

    Parameters
    ----------
    k_amax, v_amax : torch.Tensor
        [num_kv_heads] largest |value| per kv head of the calibration sample, on the device.
    """

    def __init__(self, k_amax, v_amax):
        # A head whose sample is all zero would get scale 0 (every value then saturates):
        # never the case with the normal token source, refused rather than divided by.
        if not bool((k_amax > 0).all() and (v_amax > 0).all()):
            raise ValueError("replay: fp8 calibration invalid: expected amax > 0 per kv head, got "
                             f"k {k_amax.tolist()}, v {v_amax.tolist()}")
        self.k_scale = (k_amax.float() / FP8_MAX).contiguous()  # float32 [num_kv_heads]
        self.v_scale = (v_amax.float() / FP8_MAX).contiguous()
        self._saturated = torch.zeros(2, dtype=torch.int64, device=k_amax.device)
        self.values = 0  # K values quantized (as many V)

    @staticmethod
    def _one(x, scale, saturated):
        scaled = x.float() / scale[:, None]  # x [..., num_kv_heads, head_dim]
        saturated += (scaled.abs() > FP8_MAX).sum()
        return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8)

    def quantize(self, k, v):
        """k, v [num_tokens, num_kv_heads, head_dim] -> the float8_e4m3fn values stored."""
        self.values += k.numel()
        return (self._one(k, self.k_scale, self._saturated[0]),
                self._one(v, self.v_scale, self._saturated[1]))

    def dequantize(self, k, v):
        """Stored fp8 k, v [..., num_kv_heads, head_dim] -> float64 stored * scale (NaN stays NaN)."""
        return (k.to(torch.float64) * self.k_scale.to(torch.float64)[:, None],
                v.to(torch.float64) * self.v_scale.to(torch.float64)[:, None])

    def saturated(self):
        """(K values, V values) saturated so far (one device read)."""
        k, v = self._saturated.tolist()
        return k, v
