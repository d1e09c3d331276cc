"""Dense (``features_only``) backbones as the official detection / segmentation code builds them.

PoolFormer: the official dense backbone (sail-sg/poolformer ``models/poolformer.py`` with ``fork_feat=True``)
returns the four stage outputs, each through its own GroupNorm (``norm0/2/4/6``). ``ForkFeatPoolFormer`` below
re-states it from that description on top of the independent re-statement in ``reference_poolformer.py``.
Checked once against the official code itself (a075575, run in /tmp beside ours with the same randomly
perturbed weights, 224x224 input): the four maps agreed to max |delta| 1.2e-6 / 7.6e-6 / 6.9e-6 / 9.8e-6 at
map scales of about 5 (float rounding; ours runs channels-last), loaded both from the backbone's state dict
and from a detector checkpoint (``backbone.*`` keys).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import zoo
from reference_poolformer import OfficialPoolFormer


class ForkFeatPoolFormer(OfficialPoolFormer):
    """The official dense backbone's layout: no ``norm``/``head``; ``norm{2i}`` on the output of ``network.{2i}``."""

    def __init__(self, **kw):
        super().__init__(**kw)
        dims = [blocks[0].norm1.num_channels for blocks in self.network[::2]]
        del self.norm, self.head
        for i, d in enumerate(dims):
            self.add_module(f'norm{2 * i}', nn.GroupNorm(1, d))

    def forward(self, x):
        x, outs = self.patch_embed(x), []
        for idx, m in enumerate(self.network):
            x = m(x)
            if idx % 2 == 0:
                outs.append(getattr(self, f'norm{idx}')(x))
        return outs


def _perturbed(model: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # layer scales, norms and output norms all matter
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


@pytest.fixture(scope='module')
def fork_feat_s12():
    torch.manual_seed(0)
    return _perturbed(ForkFeatPoolFormer())


@pytest.mark.parametrize('wrap', ['backbone', 'detector'])
def test_official_dense_checkpoint_gives_official_maps(fork_feat_s12, tmp_path, wrap):
    sd = fork_feat_s12.state_dict()
    expected = [f'norm{i}.{p}' for i in (0, 2, 4, 6) for p in ('bias', 'weight')]
    assert sorted(k for k in sd if k.startswith('norm')) == expected
    if wrap == 'detector':  # mmdet's layout: the backbone under backbone.*, beside the neck and heads
        sd = {'state_dict': {**{f'backbone.{k}': v for k, v in sd.items()}, 'neck.fpn.0.weight': torch.zeros(2)}}
    torch.save(sd, tmp_path / 'official.pth')
    ours = zoo.create('poolformer_s12', features_only=True, out_norm=True, checkpoint=tmp_path / 'official.pth').eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref, got = fork_feat_s12(x), ours(x)
    assert [tuple(f.shape) for f in got] == [(2, 64, 16, 16), (2, 128, 8, 8), (2, 320, 4, 4), (2, 512, 2, 2)]
    for a, b in zip(got, ref):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max()
    assert [(f.num_chs, f.reduction) for f in ours.feature_info] == [(64, 4), (128, 8), (320, 16), (512, 32)]


def test_out_norm_levels_follow_out_indices(fork_feat_s12, tmp_path):
    """RetinaNet's setting (FPN start_level=1): only the last three maps; the checkpoint's norm0 is not used."""
    torch.save(fork_feat_s12.state_dict(), tmp_path / 'official.pth')
    ours = zoo.create('poolformer_s12', features_only=True, out_norm=True, out_indices=(1, 2, 3),
                      checkpoint=tmp_path / 'official.pth').eval()
    assert sorted(ours.out_norms) == ['1', '2', '3']
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for a, b in zip(ours(x), fork_feat_s12(x)[1:]):
            assert (a - b).abs().max() <= 1e-5 * b.abs().max()


def test_out_norm_bad_combinations_are_clear_errors(fork_feat_s12, tmp_path):
    with pytest.raises(ValueError, match='needs features_only=True'):
        zoo.create('poolformer_tiny', out_norm=True)
    torch.save(fork_feat_s12.state_dict(), tmp_path / 'official.pth')
    with pytest.raises(ValueError, match='out_norm=True'):
        zoo.create('poolformer_s12', features_only=True, checkpoint=tmp_path / 'official.pth')


def test_out_norm_normalises_only_the_outputs():
    """Each map is GroupNorm(1, C) of the plain stage output; the trunk itself is not normalised."""
    torch.manual_seed(0)
    plain = zoo.create('poolformer_tiny', features_only=True).eval()
    normed = zoo.create('poolformer_tiny', features_only=True, out_norm=True).eval()
    normed.load_state_dict(plain.state_dict(), strict=False)  # same trunk, fresh (identity-affine) output norms
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for a, b in zip(normed(x), plain(x)):
            assert torch.allclose(a, nn.functional.group_norm(b, 1), atol=1e-5)


def test_imagenet_checkpoint_into_dense_backbone(tmp_path):
    """An ImageNet (classification) checkpoint starts a dense backbone: the head is dropped; output norms the
    checkpoint lacks stay newly initialised (with a warning), as the official code's non-strict load leaves them."""
    cls = zoo.create('poolformer_tiny', num_classes=7)
    torch.save(cls.state_dict(), tmp_path / 'cls.pth')
    dense = zoo.create('poolformer_tiny', features_only=True, checkpoint=tmp_path / 'cls.pth')
    assert torch.equal(dense.stem.conv.weight, cls.stem.conv.weight)
    with pytest.warns(UserWarning, match='no output norms'):
        zoo.create('poolformer_tiny', features_only=True, out_norm=True, checkpoint=tmp_path / 'cls.pth')


@pytest.mark.parametrize('name', ['resnet_tiny', 'vgg_tiny'])
def test_classifier_checkpoint_into_dense_backbone_drops_the_head(tmp_path, name):
    """A ``zoo fit`` classifier's weights start the same family's dense backbone (semfpn_pretrained in the paper
    benchmark fine-tunes a shapes-pretrained ResNet under Semantic FPN): the classifier (and any pre-logits) is a
    module the backbone does not have, so it is left out, while every backbone weight is loaded."""
    cls = zoo.create(name, num_classes=6)
    torch.save(cls.state_dict(), tmp_path / 'cls.pth')
    dense = zoo.create(name, features_only=True, checkpoint=tmp_path / 'cls.pth')
    theirs = cls.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in dense.state_dict().items())
    bad = {k: v[:1] if v.ndim else v for k, v in theirs.items()}       # a backbone weight that does not fit
    torch.save(bad, tmp_path / 'bad.pth')
    with pytest.raises(ValueError, match='shape mismatches'):
        zoo.create(name, features_only=True, checkpoint=tmp_path / 'bad.pth')


def test_zoo_args_rebuild_the_architecture_without_a_backbones_checkpoint(tmp_path):
    """``model.zoo_args`` is what ``zoo bench --db`` rebuilds a recorded network from, long after the run folder
    holding a backbone's pretrained checkpoint may be gone: the weights path is not part of the architecture."""
    cls = zoo.create('resnet_tiny', num_classes=6, stem='imagenet')
    torch.save(cls.state_dict(), tmp_path / 'cls.pth')
    seg = zoo.create('semfpn_seg_tiny', backbone='resnet_tiny', num_classes=3,
                     backbone_kwargs={'stem': 'imagenet', 'checkpoint': str(tmp_path / 'cls.pth')})
    assert seg.zoo_args['backbone_kwargs'] == {'stem': 'imagenet'}
    again = zoo.create('semfpn_seg_tiny', **seg.zoo_args)
    assert [(k, v.shape) for k, v in again.state_dict().items()] == [(k, v.shape) for k, v in seg.state_dict().items()]
