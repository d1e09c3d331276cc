"""TNT: Transformer in Transformer.

"Transformer in Transformer", Han et al., NeurIPS 2021, arXiv 2103.00112.
Official code: https://github.com/huawei-noah/CV-Backbones (``tnt_pytorch/tnt.py``);
timm port: ``timm/models/tnt.py`` (``tnt_s_patch16_224``, ``tnt_b_patch16_224``).

Data flow (224x224 input, sentence = 16x16 patch, N = 196 sentences, m = 16 words of width c,
sentence width d):

1. Word embedding: each 16x16 patch *separately* (zero padding at the patch border) goes through
   Conv2d(3, c, 7, stride 4, padding 3) -> 4x4 = 16 words; add the word position embedding
   (16, c), shared by all sentences (the paper's figure).
2. Sentence embedding: the 16 words of a sentence -> LN(16c) -> Linear(16c -> d) -> LN(d);
   prepend the class token, add the sentence position embedding (197, d).
3. 12 TNT blocks on the pair (words (B*N, 16, c), sentences (B, 197, d)): inner transformer block
   on the words; the words, flattened per sentence, -> LN(16c) -> Linear(16c -> d, no bias) -> LN(d)
   added to the sentence tokens (not the class token, no drop path); outer transformer block.
4. LN(d) and the class token -> Linear(d, num_classes).

Counting: the official model also holds ``outer_tokens``, a zero, frozen (requires_grad=False)
``nn.Parameter`` of shape (1, 196, d) that the forward pass never reads. We do not create it (timm
neither); ``remap_checkpoint`` drops it. The registered counts are the trainable ones (23,768,584 /
65,428,680); the official README's 65.6M for TNT-B counts the frozen tensor too (65,554,120).

Differences from the official code / timm, numerically neutral: q, k and v come from one fused
Linear (the official ``qk`` and ``v`` weights stacked), attention runs through
``F.scaled_dot_product_attention``, patches are cut with a reshape instead of ``nn.Unfold``, the
word position embedding is stored as (1, 16, c) like the official code (timm: (1, c, 4, 4)), and the
sentence stream is updated with a concatenation (not the official in-place write).
Speed (same parameters and function): the words are kept contiguous as (B*N, m, c) (timm leaves a
transposed view, so each block's LayerNorms read strided rows and its Linears copy their input); every
Linear goes through ``zoo.layers.onednn.linear`` (oneDNN, GELU fused, in eager CPU inference; plain ops under
compile and export); in eval mode without autograd ``forward`` (logits) runs the last
block's outer queries, projection and MLP on the class token alone, the only token the head reads
(4.90 G instead of 5.22 G MACs for tnt_s; ``forward_features`` and autograd still run every token).
This is the current (official) TNT, not timm's ``tnt_s_legacy_patch16_224`` (whole-image conv and a
different fuse), which is a different model.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from einops import rearrange
from torch import nn

from zoo.layers import DropPath, linear_drop_path_rates
from zoo.layers.mlp import Mlp
from zoo.layers.tnt import TokenAttention, WordToSentence

from ._builder import ClassifierBase, FeatureInfo, build_model, check_image, select_features
from ._registry import register_model

# einops cannot take a torch.fx Proxy: traced as one call (torch.fx.symbolic_trace, create_feature_extractor)
torch.fx.wrap('rearrange')

__all__ = ['TNT', 'TNTBlock', 'WordEmbed']


class WordEmbed(nn.Module):
    """Image -> visual words: (B, C, H, W) -> (B*N, m, c), N = (H/P)(W/P) sentences, m = ceil(P/s)^2 words.

    The convolution sees one P x P patch at a time, so its zero padding is at the patch border
    (the official TNT; timm's legacy variant convolved the whole image instead).
    """

    def __init__(self, img_size: tuple[int, int], patch_size: int, in_chans: int, inner_dim: int, stride: int):
        super().__init__()
        if img_size[0] % patch_size or img_size[1] % patch_size:
            raise ValueError(f'TNT: img_size {img_size} must be a multiple of patch_size={patch_size}')
        self.patch_size = patch_size
        self.grid_size = (img_size[0] // patch_size, img_size[1] // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.word_grid = (-(-patch_size // stride),) * 2  # ceil(P / s) words per side
        self.num_words = self.word_grid[0] * self.word_grid[1]
        self.proj = nn.Conv2d(in_chans, inner_dim, kernel_size=7, stride=stride, padding=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch_size
        x = rearrange(x, 'b c (gh p1) (gw p2) -> (b gh gw) c p1 p2', p1=p, p2=p)
        # The conv gives channels first; the words are made contiguous as (B*N, m, c) once here. Left as a
        # transposed view (as in timm), every later op inherits the c-major layout: each LayerNorm(c) reads
        # strided rows and each Linear on the words copies its input first, in all 12 blocks.
        return rearrange(self.proj(x), 'bn c wh ww -> bn (wh ww) c').contiguous()  # (B*N, m, c)


class TNTBlock(nn.Module):
    """One TNT block on the pair (words (B*N, m, c), sentences (B, 1+N, d)).

    One drop-path rate for the four residuals (official); none on the word-to-sentence term.
    """

    def __init__(self, inner_dim: int, outer_dim: int, num_words: int, inner_heads: int = 4, outer_heads: int = 12,
                 mlp_ratio: float = 4.0, inner_mlp_ratio: float = 4.0, qkv_bias: bool = False, proj_drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float = 0.0, act_layer=nn.GELU):
        super().__init__()
        # inner transformer (over the words of one sentence, shared by all sentences)
        self.inner_norm1 = nn.LayerNorm(inner_dim)
        self.inner_attn = TokenAttention(inner_dim, inner_heads, qkv_bias, attn_drop, proj_drop)
        self.inner_norm2 = nn.LayerNorm(inner_dim)
        self.inner_mlp = Mlp(inner_dim, int(inner_dim * inner_mlp_ratio), inner_dim, act_layer=act_layer, drop=proj_drop)
        self.word_to_sentence = WordToSentence(num_words * inner_dim, outer_dim, bias=False)
        # outer transformer (over the sentences of one image)
        self.outer_norm1 = nn.LayerNorm(outer_dim)
        self.outer_attn = TokenAttention(outer_dim, outer_heads, qkv_bias, attn_drop, proj_drop)
        self.outer_norm2 = nn.LayerNorm(outer_dim)
        self.outer_mlp = Mlp(outer_dim, int(outer_dim * mlp_ratio), outer_dim, act_layer=act_layer, drop=proj_drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, words: torch.Tensor, sentences: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        words, sentences = self._words_and_fuse(words, sentences)
        sentences = sentences + self.drop_path(self.outer_attn(self.outer_norm1(sentences)))
        sentences = sentences + self.drop_path(self.outer_mlp(self.outer_norm2(sentences)))
        return words, sentences

    def forward_class_token(self, words: torch.Tensor, sentences: torch.Tensor) -> torch.Tensor:
        """Only the class token's output of this block, (B, 1, d): all a classifier reads from the last block.

        Every word and sentence token still feeds it (inner transformer, fuse, the keys and values of the
        outer attention), but the outer attention's queries and projection and the outer MLP run on the
        class token alone; ``forward`` would compute the other 1+N-1 outputs and the head would drop them.
        """
        _, sentences = self._words_and_fuse(words, sentences)
        cls = sentences[:, :1] + self.drop_path(self.outer_attn(self.outer_norm1(sentences), num_queries=1))
        return cls + self.drop_path(self.outer_mlp(self.outer_norm2(cls)))

    def _words_and_fuse(self, words: torch.Tensor, sentences: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inner transformer on the words, then the words folded into the sentence tokens (not the class token)."""
        words = words + self.drop_path(self.inner_attn(self.inner_norm1(words)))
        words = words + self.drop_path(self.inner_mlp(self.inner_norm2(words)))
        b = sentences.shape[0]
        fused = self.word_to_sentence(rearrange(words, '(b n) m c -> b n (m c)', b=b))  # (B, N, d)
        # the class token (index 0) receives nothing from the words; a no-drop-path term (official)
        sentences = torch.cat([sentences[:, :1], sentences[:, 1:] + fused], dim=1)      # (B, 1+N, d), new
        return words, sentences


def _inference(module: nn.Module) -> bool:
    """Eval mode without autograd (inference_mode / no_grad): only the class token's output is read."""
    return not (module.training or torch.is_grad_enabled())


class TNT(ClassifierBase):
    """Transformer in Transformer (Han et al., 2021) with timm's classification contract.

    Args:
        img_size: the (fixed) input size; the position embeddings are built for it.
        patch_size: sentence (patch) size P in pixels; inner_stride: word size s (m = ceil(P/s)^2 words).
        embed_dim / inner_dim: sentence width d / word width c.
        depth, outer_heads, inner_heads, mlp_ratio (outer), inner_mlp_ratio.
        features_only / out_indices: return the sentence maps (B, d, H/P, W/P) after the blocks in
            ``out_indices`` (default: the last block's alone) instead of logits.
    """

    def __init__(self, img_size: int | Sequence[int] = 224, patch_size: int = 16, in_chans: int = 3,
                 num_classes: int = 1000, embed_dim: int = 384, inner_dim: int = 24, depth: int = 12,
                 outer_heads: int = 6, inner_heads: int = 4, mlp_ratio: float = 4.0, inner_mlp_ratio: float = 4.0,
                 inner_stride: int = 4, qkv_bias: bool = False, drop_rate: float = 0.0, pos_drop_rate: float = 0.0,
                 proj_drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 act_layer=nn.GELU, features_only: bool = False, out_indices: Sequence[int] | None = None):
        super().__init__()
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.num_features = embed_dim
        self.word_embed = WordEmbed(self.img_size, patch_size, in_chans, inner_dim, inner_stride)
        n, m = self.word_embed.num_patches, self.word_embed.num_words
        self.word_pos = nn.Parameter(torch.zeros(1, m, inner_dim))             # shared by all sentences
        self.sentence_embed = WordToSentence(m * inner_dim, embed_dim, bias=True)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.sentence_pos = nn.Parameter(torch.zeros(1, n + 1, embed_dim))
        self.pos_drop = nn.Dropout(pos_drop_rate)
        rates = linear_drop_path_rates(drop_path_rate, [depth])[0]  # 0 .. drop_path_rate
        self.blocks = nn.ModuleList([
            TNTBlock(inner_dim, embed_dim, m, inner_heads, outer_heads, mlp_ratio, inner_mlp_ratio, qkv_bias,
                     proj_drop_rate, attn_drop_rate, rates[i], act_layer) for i in range(depth)])
        self.features_only = features_only
        info = [FeatureInfo(embed_dim, patch_size, f'blocks.{i}') for i in range(depth)]  # timm's: one per block
        if out_indices is None and features_only:
            out_indices = (-1,)
        self.out_indices, self.feature_info = select_features(info, out_indices, features_only)
        if features_only:
            self.norm = self.head_drop = self.head = None
        else:
            self.norm = nn.LayerNorm(embed_dim)
            self.head_drop = nn.Dropout(drop_rate)
            self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        for p in (self.word_pos, self.cls_token, self.sentence_pos):
            nn.init.trunc_normal_(p, std=0.02)
        self.apply(self._init_weights)

    classifier_prefix = 'head'
    first_conv = 'word_embed.proj'
    fixed_input_size = True  # the position embeddings are built for img_size (timm's TNT says the same)
    global_pool = 'token'    # the class token; timm's TNT also offers 'avg' (mean of the patch tokens)
    pool_types = ('token', 'avg', '')
    stage_modules_give_maps = False  # a block gives (words, sentences) tokens; its map is made after it
    data_cfg = dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), crop_pct=0.9)  # official and timm evaluation

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        # Official init: trunc_normal(.02) on every Linear, zero bias; LayerNorm 1/0; the conv keeps PyTorch's.
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def no_weight_decay(self) -> set[str]:
        return {'word_pos', 'sentence_pos', 'cls_token'}

    def forward(self, x: torch.Tensor):
        """Logits (B, num_classes); with ``features_only``, the maps of ``forward_intermediates``.

        Equals ``forward_head(forward_features(x))``. In eval mode without autograd (inference), the last
        block computes the class token alone (``TNTBlock.forward_class_token``), the only token the head
        reads; with autograd (training, MAC counting) every token runs through every block.
        """
        if self.features_only or not _inference(self) or self.global_pool != 'token':
            return super().forward(x)
        state = self.forward_stem(x)
        for i in range(self.num_stages - 1):
            state = self.forward_stage(i, state)
        return self.forward_head(self.norm(self.blocks[-1].forward_class_token(*state)))  # (B, 1, d) normed

    # -- the stages timm's contract runs (zoo._builder.ClassifierBase): one per block ------------------------
    stages_attr = 'blocks'
    stem_names = ('word_embed', 'word_pos', 'sentence_embed', 'cls_token', 'sentence_pos')
    final_norm_attr = 'norm'

    def forward_stem(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C, H, W) -> (words (B*N, m, c), sentences (B, 1+N, d)), the pair every block takes."""
        check_image(x, self.in_chans, min_size=self.word_embed.patch_size, model=getattr(self, 'zoo_name', 'TNT'),
                    fixed_size=self.img_size)
        b = x.shape[0]
        words = self.word_embed(x) + self.word_pos                                    # (B*N, m, c)
        sentences = self.sentence_embed(rearrange(words, '(b n) m c -> b n (m c)', b=b))  # (B, N, d)
        sentences = torch.cat([self.cls_token.expand(b, -1, -1), sentences], dim=1) + self.sentence_pos
        return words, self.pos_drop(sentences)                                        # (B, 1+N, d)

    def stage_output(self, i: int, state, norm: bool = False) -> torch.Tensor:
        """Block ``i``'s sentence tokens as a map (B, d, H/P, W/P), class token dropped (``norm``: normed first)."""
        t = self.norm(state[1]) if norm and self.norm is not None else state[1]
        gh, gw = self.word_embed.grid_size
        return rearrange(t[:, 1:], 'b (h w) d -> b d h w', h=gh, w=gw)

    def forward_final(self, state) -> torch.Tensor:
        """Normed sentence tokens (B, 1 + N, d), class token first (``forward_features``)."""
        return state[1] if self.norm is None else self.norm(state[1])

    def unpooled_size(self, h: int, w: int) -> None:
        return None  # forward_features gives tokens (B, 1 + N, d)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if not self.global_pool:  # global_pool='': every token, unpooled
            return x
        x = self.head_drop(x[:, 1:].mean(1) if self.global_pool == 'avg' else x[:, 0])  # patch mean / class token
        return x if pre_logits else self.head(x)


    # ---- checkpoint key mapping -------------------------------------------------------------------

    @staticmethod
    def remap_checkpoint(state_dict: dict) -> dict:
        """Map a timm (``tnt_s_patch16_224``, not ``_legacy``) or official TNT state dict onto ours.

        timm: ``pixel_embed.proj``, ``pixel_pos`` (1, c, a, b), ``patch_pos``, ``norm1_proj/proj/norm2_proj``,
        blocks ``norm_in, attn_in.{qk,v,proj}, norm_mlp_in, mlp_in, norm1_proj, proj, norm2_proj, norm_out,
        attn_out, norm_mlp, mlp``. Official: ``patch_embed.proj``, ``inner_pos`` (1, m, c), ``outer_pos``,
        ``proj_norm1/proj/proj_norm2``, blocks ``inner_*``, ``proj_norm1/proj/proj_norm2``, ``outer_*``,
        and the unused frozen ``outer_tokens`` (dropped). A state dict in our layout passes through.
        """
        if 'sentence_pos' in state_dict:
            return dict(state_dict)
        if 'patch_pos' in state_dict:
            rules = _TIMM_RULES
        elif 'outer_pos' in state_dict:
            rules = _OFFICIAL_RULES
        else:
            raise KeyError('not a TNT state dict: expected sentence_pos (zoo), patch_pos (timm) or outer_pos '
                           f'(official); got keys {list(state_dict)[:6]}...')
        if rules is _TIMM_RULES and 'blocks.0.proj.bias' in state_dict:
            raise KeyError("this is timm's tnt_s_legacy_patch16_224 layout (whole-image conv, a different fuse): "
                           'a different model, which zoo TNT does not implement')
        out = {}
        for k, v in state_dict.items():
            if k == 'outer_tokens':
                continue  # frozen, never used by the forward pass
            for pattern, repl in rules:
                k, n = re.subn(pattern, repl, k)
                if n:
                    break
            if k == 'word_pos' and v.ndim == 4:
                v = rearrange(v, '1 c a b -> 1 (a b) c')  # timm keeps it as a (c, a, b) map
            out[k] = v
        # q, k and v: the official/timm (qk, v) Linears stacked into one qkv Linear
        for k in [k for k in out if k.endswith('_attn.qk.weight') or k.endswith('_attn.qk.bias')]:
            prefix, kind = k.rsplit('.qk.', 1)
            out[f'{prefix}.qkv.{kind}'] = torch.cat([out.pop(k), out.pop(f'{prefix}.v.{kind}')], dim=0)
        return out

    @staticmethod
    def to_timm(state_dict: dict) -> dict:
        """Our state dict in timm's ``tnt_*_patch16_224`` layout (the inverse of ``remap_checkpoint``)."""
        out = {}
        for k, v in state_dict.items():
            for pattern, repl in _TO_TIMM_RULES:
                k, n = re.subn(pattern, repl, k)
                if n:
                    break
            if k == 'pixel_pos':
                a = int(round(v.shape[1] ** 0.5))
                v = rearrange(v, '1 (a b) c -> 1 c a b', a=a)
            if '.qkv.' in k:
                prefix, kind = k.rsplit('.qkv.', 1)
                d = v.shape[0] // 3
                out[f'{prefix}.qk.{kind}'], out[f'{prefix}.v.{kind}'] = v[:2 * d], v[2 * d:]
                continue
            out[k] = v
        return out


_BLOCK_TIMM = [('norm_in', 'inner_norm1'), ('attn_in', 'inner_attn'), ('norm_mlp_in', 'inner_norm2'),
               ('mlp_in', 'inner_mlp'), ('norm1_proj', 'word_to_sentence.norm1'), ('proj', 'word_to_sentence.proj'),
               ('norm2_proj', 'word_to_sentence.norm2'), ('norm_out', 'outer_norm1'), ('attn_out', 'outer_attn'),
               ('norm_mlp', 'outer_norm2'), ('mlp', 'outer_mlp')]
_STEM_TIMM = [('pixel_embed', 'word_embed'), ('pixel_pos', 'word_pos'), ('patch_pos', 'sentence_pos'),
              ('norm1_proj', 'sentence_embed.norm1'), ('proj', 'sentence_embed.proj'),
              ('norm2_proj', 'sentence_embed.norm2')]
# (regex, replacement) pairs, first match wins; anchored so that 'proj' never hits 'attn_in.proj'.
_TIMM_RULES = ([(rf'^blocks\.(\d+)\.{a}\.', rf'blocks.\1.{b}.') for a, b in _BLOCK_TIMM]
               + [(rf'^{a}(\.|$)', rf'{b}\1') for a, b in _STEM_TIMM])
_TO_TIMM_RULES = ([(rf'^blocks\.(\d+)\.{re.escape(b)}\.', rf'blocks.\1.{a}.') for a, b in _BLOCK_TIMM]
                  + [(rf'^{re.escape(b)}(\.|$)', rf'{a}\1') for a, b in _STEM_TIMM])
_OFFICIAL_RULES = ([(rf'^blocks\.(\d+)\.{a}\.', rf'blocks.\1.{b}.') for a, b in
                    [('proj_norm1', 'word_to_sentence.norm1'), ('proj', 'word_to_sentence.proj'),
                     ('proj_norm2', 'word_to_sentence.norm2')]]
                   + [(rf'^{a}(\.|$)', rf'{b}\1') for a, b in
                      [('patch_embed', 'word_embed'), ('inner_pos', 'word_pos'), ('outer_pos', 'sentence_pos'),
                       ('proj_norm1', 'sentence_embed.norm1'), ('proj', 'sentence_embed.proj'),
                       ('proj_norm2', 'sentence_embed.norm2')]])


def _create(cfg: dict, kwargs: dict) -> TNT:
    return build_model(TNT, cfg, kwargs)


_TNT = dict(family='tnt', paper='Transformer in Transformer (arXiv 2103.00112)',
            repo='https://github.com/huawei-noah/CV-Backbones/tree/master/tnt_pytorch', input_size=(3, 224, 224),
            capabilities=('features', 'timm_weights', 'official_weights'), tiny='tnt_tiny')


@register_model(**_TNT, timm_equivalent=('tnt_s_patch16_224', {}), params=23_768_584, macs=5_245_147_008, top1=81.5)
def tnt_s(**kwargs):
    """TNT-S: d 384 (6 heads), c 24 (4 heads), depth 12, 16x16 sentences of 4x4 words. 23.8M params."""
    return _create(dict(embed_dim=384, inner_dim=24, depth=12, outer_heads=6, inner_heads=4, drop_path_rate=0.1),
                   kwargs)


@register_model(**_TNT, timm_equivalent=('tnt_b_patch16_224', {}), params=65_428_680, macs=14_096_202_880, top1=82.9)
def tnt_b(**kwargs):
    """TNT-B: d 640 (10 heads), c 40 (4 heads), depth 12. 65.4M trainable (the README's 65.6M counts outer_tokens)."""
    return _create(dict(embed_dim=640, inner_dim=40, depth=12, outer_heads=10, inner_heads=4, drop_path_rate=0.1),
                   kwargs)


@register_model(**{**_TNT, 'input_size': (3, 32, 32)})
def tnt_tiny(**kwargs):
    """A CPU-sized TNT for 32x32 images: 4x4 = 16 sentences of 8x8 pixels, each of 4x4 = 16 words (stride 2),
    as TNT-S has 16 words per sentence; d 96 (3 heads), c 12 (2 heads), depth 4. 0.55 M params."""
    return _create(dict(img_size=32, patch_size=8, inner_stride=2, embed_dim=96, inner_dim=12, depth=4,
                        outer_heads=3, inner_heads=2), kwargs)
