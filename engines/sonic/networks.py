"""Sonic's own networks around Stable Video Diffusion's (diffusers/transformers blocks, the `[sonic]` extra).

Re-implemented here (no library holds them), keys and shapes equal to the release's files:
- AudioTokens (`Sonic/audio2token.pth`): 10 whisper frames x 5 encoder states -> 32 audio tokens per frame.
- AudioBucket (`Sonic/audio2bucket.pth`): 50 whisper frames + the CLIP image embedding -> 2 motion values.
- AudioAttnProcessor: the cross-attention of every SVD transformer block with a second, audio key/value
  (`attn2.processor.to_k_ip.0/to_v_ip.0`), masked to the face box in the spatial blocks.
- SonicUNet: diffusers' UNetSpatioTemporalConditionModel whose transformers see the audio tokens, and whose
  temporal cross-attention reads the window's mean context (Sonic's change to SVD).
- IFNet (`RIFE/flownet.pkl`): RIFE HDv3's flow network (three IFBlocks), for 12.5 -> 25 fps.
Sizes are read from the files' shapes and configs, so reduced random releases (tests) load the same way.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class AudioTokens(nn.Module):
    """audio2token: [B, F, 10, 5, 384] whisper windows -> [B, F, 32, 1024] tokens (relu MLP + LayerNorm)."""

    def __init__(self, input_dim: int, intermediate_dim: int, context_tokens: int, output_dim: int):
        super().__init__()
        self.context_tokens, self.output_dim = context_tokens, output_dim
        self.proj1 = nn.Linear(input_dim, intermediate_dim)
        self.proj2 = nn.Linear(intermediate_dim, intermediate_dim)
        self.proj3 = nn.Linear(intermediate_dim, context_tokens * output_dim)
        self.norm = nn.LayerNorm(output_dim)

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        b, f = windows.shape[:2]
        x = windows.reshape(b * f, -1)
        x = torch.relu(self.proj2(torch.relu(self.proj1(x))))
        x = self.norm(self.proj3(x).reshape(b * f, self.context_tokens, self.output_dim))
        return x.reshape(b, f, self.context_tokens, self.output_dim)


class AudioBucket(nn.Module):
    """audio2bucket: [B, F, 50, 1, 384] last-state windows + [B, 1024] CLIP embedding -> [B, F, 2, 1] (SiLU MLP)."""

    def __init__(self, input_dim: int, intermediate_dim: int, context_tokens: int, output_dim: int):
        super().__init__()
        self.context_tokens, self.output_dim = context_tokens, output_dim
        self.proj1 = nn.Linear(input_dim, intermediate_dim)
        self.proj2 = nn.Linear(intermediate_dim, intermediate_dim)
        self.proj3 = nn.Linear(intermediate_dim, context_tokens * output_dim)

    def forward(self, windows: torch.Tensor, clip_embeds: torch.Tensor) -> torch.Tensor:
        b, f = windows.shape[:2]
        x = torch.cat([windows.reshape(b * f, -1), clip_embeds.reshape(b * f, -1)], dim=-1)
        x = F.silu(self.proj2(F.silu(self.proj1(x))))
        return self.proj3(x).reshape(b, f, self.context_tokens, self.output_dim)


def mlp_from_state(cls, state: dict) -> nn.Module:
    """An AudioTokens/AudioBucket sized by its state dict's shapes (proj1 in/out, proj3 out, norm)."""
    inter, input_dim = state["proj1.weight"].shape
    out_dim = state["norm.weight"].shape[0] if "norm.weight" in state else 1
    tokens = state["proj3.weight"].shape[0] // out_dim
    return cls(int(input_dim), int(inter), int(tokens), int(out_dim))


# --- the UNet's audio attention ---------------------------------------------------------------------
def mask_for_queries(mask: torch.Tensor, num_queries: int) -> torch.Tensor:
    """The face mask [1, 1, H, W] at the attention's token grid, [1, num_queries, 1] (bicubic; the grid's
    height as SVD's latent pyramid gives it: ceil of sqrt(queries / aspect))."""
    h, w = mask.shape[-2:]
    ratio = w / h
    mask_h = int(math.sqrt(num_queries / ratio))
    mask_h = mask_h + int(num_queries % mask_h != 0)
    mask_w = num_queries // mask_h
    small = F.interpolate(mask.float(), size=(mask_h, mask_w), mode="bicubic").reshape(1, -1)
    area = mask_h * mask_w
    if area < num_queries:
        small = F.pad(small, (0, num_queries - area))
    return small[:, :num_queries, None]


class AudioAttnProcessor(nn.Module):
    """Cross-attention to the CLIP context plus, scaled by `scale`, to the audio tokens (keys/values from
    to_k_ip/to_v_ip). `encoder_hidden_states` is (context, audio); in the spatial blocks the audio part is
    weighted by the face mask at this resolution (`ip_adapter_masks`, diffusers' and the reference's name: the
    spatial blocks pass it per call, so torch.compile sees no module state change)."""

    def __init__(self, hidden_size: int, cross_attention_dim: int, scale: float = 1.0):
        super().__init__()
        self.scale = scale
        self.to_k_ip = nn.ModuleList([nn.Linear(cross_attention_dim, hidden_size, bias=False)])
        self.to_v_ip = nn.ModuleList([nn.Linear(cross_attention_dim, hidden_size, bias=False)])

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None,
                 ip_adapter_masks: torch.Tensor | None = None, **kwargs):
        context, audio = encoder_hidden_states
        b = hidden_states.shape[0]
        heads = attn.heads
        query = attn.to_q(hidden_states)
        head_dim = query.shape[-1] // heads
        # temporal blocks pass one context per video (not one per spatial position, as the reference repeats it):
        # the queries of all positions of a video attend to the same keys/values, computed once
        groups = context.shape[0]

        def split(x):
            return x.reshape(groups, -1, heads, head_dim).transpose(1, 2)

        q = split(query)
        out = F.scaled_dot_product_attention(q, split(attn.to_k(context)), split(attn.to_v(context)))
        out = out.transpose(1, 2).reshape(b, -1, heads * head_dim).to(query.dtype)
        if self.scale != 0:
            ip = F.scaled_dot_product_attention(q, split(self.to_k_ip[0](audio)), split(self.to_v_ip[0](audio)))
            ip = ip.transpose(1, 2).reshape(b, -1, heads * head_dim).to(query.dtype)
            if ip_adapter_masks is not None:  # [1, 1, H, W] in the spatial blocks; the temporal ones are unmasked
                ip = ip * mask_for_queries(ip_adapter_masks, ip.shape[1]).to(ip.dtype)
            out = out + self.scale * ip
        out = attn.to_out[1](attn.to_out[0](out))
        if attn.residual_connection:
            out = out + hidden_states
        return out / attn.rescale_output_factor


def _mean_context(x: torch.Tensor, batch: int, frames: int) -> torch.Tensor:
    """Sonic's temporal context: the window's mean over frames [batch, tokens, D], the same for every spatial
    position (AudioAttnProcessor attends all of a video's positions to it at once)."""
    return x.reshape(batch, frames, x.shape[-2], x.shape[-1]).mean(dim=1)


def sonic_transformer_forward(module, hidden_states, context, audio, mask, image_only_indicator):
    """TransformerSpatioTemporalModel.forward as Sonic runs it: spatial blocks with (context, audio) and the
    face mask; temporal blocks with the frame-mean context and audio, unmasked."""
    batch_frames, _, height, width = hidden_states.shape
    frames = image_only_indicator.shape[-1]
    batch = batch_frames // frames
    time_context = (_mean_context(context, batch, frames), _mean_context(audio, batch, frames))
    residual = hidden_states
    hidden_states = module.norm(hidden_states)
    inner_dim = hidden_states.shape[1]
    hidden_states = hidden_states.permute(0, 2, 3, 1).reshape(batch_frames, height * width, inner_dim)
    hidden_states = module.proj_in(hidden_states)
    frame_ids = torch.arange(frames, device=hidden_states.device).repeat(batch, 1).reshape(-1)
    emb = module.time_pos_embed(module.time_proj(frame_ids).to(dtype=hidden_states.dtype))[:, None, :]
    for block, temporal_block in zip(module.transformer_blocks, module.temporal_transformer_blocks):
        hidden_states = block(hidden_states, encoder_hidden_states=(context, audio),
                              cross_attention_kwargs={"ip_adapter_masks": mask})
        mixed = temporal_block(hidden_states + emb, num_frames=frames, encoder_hidden_states=time_context)
        hidden_states = module.time_mixer(x_spatial=hidden_states, x_temporal=mixed,
                                          image_only_indicator=image_only_indicator)
    hidden_states = module.proj_out(hidden_states)
    hidden_states = hidden_states.reshape(batch_frames, height, width, inner_dim).permute(0, 3, 1, 2)
    # back in the residual's layout: NCHW needs a copy, channels_last (accelerate.channels_last) is this view already
    nhwc = residual.is_contiguous(memory_format=torch.channels_last) and not residual.is_contiguous()
    hidden_states = hidden_states.contiguous(memory_format=torch.channels_last if nhwc else torch.contiguous_format)
    return hidden_states + residual


def _transformer(module):
    """sonic_transformer_forward, or the compiled version accelerate.compile_regions put on the module."""
    return module.__dict__.get("sonic_forward", sonic_transformer_forward)


def add_audio_processors(unet, scale: float = 1.0) -> None:
    """Every cross-attention (attn2) of the UNet gets an AudioAttnProcessor (keys `...attn2.processor.to_k_ip.0`)."""
    dim = unet.config.cross_attention_dim
    for name, module in unet.named_modules():
        if name.endswith("attn2") and hasattr(module, "set_processor"):
            module.set_processor(AudioAttnProcessor(module.to_q.out_features, dim, scale))


def _run_block(block, hidden, temb, context, audio, mask, indicator, res=None):
    """One down/up block of the SVD UNet (resnet, then its transformer as Sonic runs it); `res`: an up block's
    skip connections. Returns (hidden, the outputs the down path keeps)."""
    outputs = []
    attentions = getattr(block, "attentions", None)
    res = list(res) if res is not None else None
    for i, resnet in enumerate(block.resnets):
        if res is not None:
            hidden = torch.cat([hidden, res.pop()], dim=1)
        hidden = resnet(hidden, temb, image_only_indicator=indicator)
        if attentions is not None:
            hidden = _transformer(attentions[i])(attentions[i], hidden, context, audio, mask, indicator)
        outputs.append(hidden)
    return hidden, outputs


def _run_mid(block, hidden, temb, context, audio, mask, indicator):
    """The mid block: resnet, then (transformer, resnet) pairs."""
    hidden = block.resnets[0](hidden, temb, image_only_indicator=indicator)
    for attn, resnet in zip(block.attentions, block.resnets[1:]):
        hidden = _transformer(attn)(attn, hidden, context, audio, mask, indicator)
        hidden = resnet(hidden, temb, image_only_indicator=indicator)
    return hidden


def make_sonic_unet_class():
    """SonicUNet (a subclass of diffusers' UNetSpatioTemporalConditionModel; diffusers is imported lazily)."""
    from diffusers import UNetSpatioTemporalConditionModel

    class SonicUNet(UNetSpatioTemporalConditionModel):
        """forward(sample [B, F, 8, h, w], t, context [B*F, 1, D], audio [B*F, 32, D], added_time_ids [B, 3],
        mask [1, 1, H, W]) -> v-prediction [B, F, 4, h, w]."""

        def forward(self, sample, timestep, context, audio, added_time_ids, mask,  # type: ignore[override]
                    deep=None, keep_deep: bool = False):
            """deep / keep_deep: DeepCache-style reuse (the faster mode). keep_deep=True also returns the deep
            features (the second-to-last up block's output before its upsampler: a quarter of the memory of the
            last up block's input); deep=<those features> runs only the shallow path (conv_in, the first down
            block, that upsampler, the last up block), so a call costs the full-resolution level alone."""
            batch, frames = sample.shape[:2]
            timesteps = timestep if torch.is_tensor(timestep) else torch.tensor([timestep], device=sample.device)
            timesteps = timesteps.reshape(-1).to(sample.device).expand(batch)
            emb = self.time_embedding(self.time_proj(timesteps).to(dtype=sample.dtype))
            time_embeds = self.add_time_proj(added_time_ids.flatten()).reshape(batch, -1).to(emb.dtype)
            emb = (emb + self.add_embedding(time_embeds)).repeat_interleave(frames, dim=0)
            hidden = self.conv_in(sample.flatten(0, 1))
            indicator = torch.zeros(batch, frames, dtype=hidden.dtype, device=hidden.device)
            skips = [hidden]
            if deep is None:
                for block in self.down_blocks:
                    hidden, outs = _run_block(block, hidden, emb, context, audio, mask, indicator)
                    if block.downsamplers is not None:
                        for down in block.downsamplers:
                            hidden = down(hidden)
                        outs.append(hidden)
                    skips += outs
                hidden = _run_mid(self.mid_block, hidden, emb, context, audio, mask, indicator)
                for block in self.up_blocks[:-2]:
                    n = len(block.resnets)
                    res, skips = skips[-n:], skips[:-n]
                    hidden, _ = _run_block(block, hidden, emb, context, audio, mask, indicator, res=res)
                    for up in block.upsamplers or ():
                        hidden = up(hidden)
                block = self.up_blocks[-2]
                n = len(block.resnets)
                res, skips = skips[-n:], skips[:-n]
                hidden, _ = _run_block(block, hidden, emb, context, audio, mask, indicator, res=res)
            else:
                # the last up block reads conv_in's output and the first down block's (before its downsampler)
                _, outs = _run_block(self.down_blocks[0], hidden, emb, context, audio, mask, indicator)
                skips += outs
                hidden = deep
            kept = hidden
            for up in self.up_blocks[-2].upsamplers or ():
                hidden = up(hidden)
            last = self.up_blocks[-1]
            hidden, _ = _run_block(last, hidden, emb, context, audio, mask, indicator, res=skips[-len(last.resnets):])
            for up in last.upsamplers or ():
                hidden = up(hidden)
            hidden = self.conv_out(self.conv_act(self.conv_norm_out(hidden)))
            out = hidden.reshape(batch, frames, *hidden.shape[1:])
            return (out, kept) if keep_deep else out

    return SonicUNet


# --- RIFE HDv3 (12.5 -> 25 fps) ---------------------------------------------------------------------
def _conv(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=True), nn.PReLU(cout))


class IFBlock(nn.Module):
    def __init__(self, in_planes: int, c: int):
        super().__init__()
        self.conv0 = nn.Sequential(_conv(in_planes, c // 2, 2), _conv(c // 2, c, 2))
        for i in range(4):
            setattr(self, f"convblock{i}", nn.Sequential(_conv(c, c), _conv(c, c)))
        self.conv1 = nn.Sequential(nn.ConvTranspose2d(c, c // 2, 4, 2, 1), nn.PReLU(c // 2),
                                   nn.ConvTranspose2d(c // 2, 4, 4, 2, 1))
        self.conv2 = nn.Sequential(nn.ConvTranspose2d(c, c // 2, 4, 2, 1), nn.PReLU(c // 2),
                                   nn.ConvTranspose2d(c // 2, 1, 4, 2, 1))

    def forward(self, x, flow, scale: float):
        def resize(t, s):
            return F.interpolate(t, scale_factor=s, mode="bilinear", align_corners=False, recompute_scale_factor=False)

        x = resize(x, 1.0 / scale)
        flow = resize(flow, 1.0 / scale) * (1.0 / scale)
        feat = self.conv0(torch.cat((x, flow), 1))
        for i in range(4):
            feat = getattr(self, f"convblock{i}")(feat) + feat
        return resize(self.conv1(feat), scale) * scale, resize(self.conv2(feat), scale)


def backward_warp(image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    """RIFE's warp: bilinear sampling at pixel + flow, borders repeated, corners aligned."""
    b, _, h, w = flow.shape
    gx = torch.linspace(-1.0, 1.0, w, device=flow.device, dtype=flow.dtype).view(1, 1, 1, w).expand(b, -1, h, -1)
    gy = torch.linspace(-1.0, 1.0, h, device=flow.device, dtype=flow.dtype).view(1, 1, h, 1).expand(b, -1, -1, w)
    flow = torch.cat([flow[:, 0:1] / ((image.shape[3] - 1.0) / 2.0), flow[:, 1:2] / ((image.shape[2] - 1.0) / 2.0)], 1)
    grid = (torch.cat([gx, gy], 1) + flow).permute(0, 2, 3, 1)
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=True)


class IFNet(nn.Module):
    """RIFE HDv3's IFNet as the release's flownet.pkl holds it (block_tea is in the file, unused at inference)."""

    def __init__(self, c: int = 90):
        super().__init__()
        self.block0, self.block1, self.block2 = IFBlock(7 + 4, c), IFBlock(7 + 4, c), IFBlock(7 + 4, c)
        self.block_tea = IFBlock(10 + 4, c)

    def forward(self, img0: torch.Tensor, img1: torch.Tensor) -> torch.Tensor:
        """The middle frame of two [B, 3, H, W] frames in 0..1 (scales 4, 2, 1)."""
        flow = img0.new_zeros(img0.shape[0], 4, *img0.shape[2:])
        mask = img0.new_zeros(img0.shape[0], 1, *img0.shape[2:])
        warped0, warped1 = img0, img1
        for block, scale in zip((self.block0, self.block1, self.block2), (4, 2, 1)):
            f0, m0 = block(torch.cat((warped0, warped1, mask), 1), flow, scale)
            f1, m1 = block(torch.cat((warped1, warped0, -mask), 1), torch.cat((flow[:, 2:4], flow[:, :2]), 1), scale)
            flow = flow + (f0 + torch.cat((f1[:, 2:4], f1[:, :2]), 1)) / 2
            mask = mask + (m0 + (-m1)) / 2
            warped0, warped1 = backward_warp(img0, flow[:, :2]), backward_warp(img1, flow[:, 2:4])
        weight = torch.sigmoid(mask)
        return warped0 * weight + warped1 * (1 - weight)
