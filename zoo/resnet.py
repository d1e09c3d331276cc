"""ResNet with interchangeable convolutions and ConvBN modes.

Paper: He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016, arXiv 1512.03385).
Reference implementation: torchvision.models.resnet (https://github.com/pytorch/vision), whose
"v1.5" layout we follow (stride on the 3x3 conv of a bottleneck); parameter counts are identical.

Every Conv+BN pair is a :class:`zoo.layers.convbn.ConvBN`, so ``convbn_mode`` (or
``zoo.layers.convbn.set_mode``) switches train / eval / deploy / tune, and ``conv_layer='weighted'``
with ``den=[0.7]`` puts the weighted convolution (Cammarasana & Patanè 2025) in every 3x3 conv
(1x1 shortcuts and a 7x7 stem stay standard unless ``den={3: [...], 7: [...]}`` names them).
``stem='imagenet'`` is the 7x7/2 conv + 3x3/2 max-pool for 224x224; ``stem='cifar'`` a 3x3/1 conv
and no pooling for 32x32.
"""
from __future__ import annotations

import torch
from torch import nn

from zoo.layers.convbn import ConvBN
from zoo.layers.weighted_conv import conv_factory

from ._builder import ClassifierBase, FeatureInfo, build_model, check_image, select_features
from ._registry import register_model

__all__ = ['ResNet', 'BasicBlock', 'Bottleneck']


class BasicBlock(nn.Module):
    """Two 3x3 ConvBNs and an identity (or 1x1 ConvBN) shortcut."""
    expansion = 1

    def __init__(self, in_chs: int, chs: int, stride: int = 1, conv_layer=nn.Conv2d, mode: str = 'train'):
        super().__init__()
        out = chs * self.expansion
        self.conv1 = ConvBN(in_chs, chs, 3, stride, 1, conv_layer=conv_layer, mode=mode)
        self.conv2 = ConvBN(chs, out, 3, 1, 1, conv_layer=conv_layer, mode=mode)
        self.act = nn.ReLU(inplace=True)
        self.downsample = (ConvBN(in_chs, out, 1, stride, conv_layer=conv_layer, mode=mode)
                           if stride != 1 or in_chs != out else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.act(self.conv2(self.act(self.conv1(x))) + shortcut)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand (x4), each a ConvBN."""
    expansion = 4

    def __init__(self, in_chs: int, chs: int, stride: int = 1, conv_layer=nn.Conv2d, mode: str = 'train'):
        super().__init__()
        out = chs * self.expansion
        self.conv1 = ConvBN(in_chs, chs, 1, conv_layer=conv_layer, mode=mode)
        self.conv2 = ConvBN(chs, chs, 3, stride, 1, conv_layer=conv_layer, mode=mode)
        self.conv3 = ConvBN(chs, out, 1, conv_layer=conv_layer, mode=mode)
        self.act = nn.ReLU(inplace=True)
        self.downsample = (ConvBN(in_chs, out, 1, stride, conv_layer=conv_layer, mode=mode)
                           if stride != 1 or in_chs != out else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.act(self.conv2(self.act(self.conv1(x))))
        return self.act(self.conv3(out) + shortcut)


_BLOCKS = {'basic': BasicBlock, 'bottleneck': Bottleneck}


class ResNet(ClassifierBase):
    """ResNet (He et al. 2016) with ``conv_layer``/``den`` for the convolutions and ``convbn_mode`` for the pairs."""

    head_attr = 'fc'
    classifier_prefix = 'fc'
    stages_attr = 'layers'
    first_conv = 'stem.0.conv'

    def __init__(self, block: str = 'basic', layers=(2, 2, 2, 2), num_classes: int = 1000, in_chans: int = 3,
                 widths=(64, 128, 256, 512), stem: str = 'imagenet', conv_layer='standard', den=None,
                 trainable_den: bool = False, convbn_mode: str = 'train', drop_rate: float = 0.0,
                 features_only: bool = False, out_indices=None):
        super().__init__()
        if block not in _BLOCKS:
            raise ValueError(f'block must be one of {list(_BLOCKS)}, got {block!r}')
        if stem not in ('imagenet', 'cifar'):
            raise ValueError(f"stem must be 'imagenet' (224x224) or 'cifar' (32x32), got {stem!r}")
        if len(layers) != len(widths):
            raise ValueError(f'layers {tuple(layers)} and widths {tuple(widths)} must have one entry per stage')
        blk, conv = _BLOCKS[block], conv_factory(conv_layer, den, trainable_den)
        self.in_chans, self.num_classes = in_chans, num_classes
        if stem == 'imagenet':
            self.stem = nn.Sequential(ConvBN(in_chans, widths[0], 7, 2, 3, conv_layer=conv, mode=convbn_mode),
                                      nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
            reduction = 4
        else:
            self.stem = nn.Sequential(ConvBN(in_chans, widths[0], 3, 1, 1, conv_layer=conv, mode=convbn_mode),
                                      nn.ReLU(inplace=True))
            reduction = 1
        stages, info, chs = [], [], widths[0]
        for i, (n, w) in enumerate(zip(layers, widths)):
            stride = 1 if i == 0 else 2
            reduction *= stride
            blocks = []
            for j in range(n):
                blocks.append(blk(chs, w, stride if j == 0 else 1, conv, convbn_mode))
                chs = w * blk.expansion
            stages.append(nn.Sequential(*blocks))
            info.append(FeatureInfo(chs, reduction, f'layers.{i}'))
        self.layers = nn.ModuleList(stages)
        self.num_features = chs
        self.features_only = features_only
        self.out_indices, self.feature_info = select_features(info, out_indices, features_only)
        if not features_only:
            self.drop = nn.Dropout(drop_rate)
            self.fc = nn.Linear(chs, num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        """The stem; the stages (``layers``) then give the ``feature_info`` maps (ClassifierBase runs them)."""
        check_image(x, self.in_chans, 1, type(self).__name__)
        return self.stem(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if not self.global_pool:  # global_pool='': the unpooled maps
            return x
        x = self.drop(x.mean((2, 3)))  # (B, C, H, W) -> (B, C)
        return x if pre_logits else self.fc(x)

    def remap_checkpoint(self, state_dict: dict) -> dict:
        """Map torchvision's ResNet layout (timm's ``resnet18/34/50`` use the same keys) onto ours; ours is
        returned unchanged.

        torchvision: ``conv1``/``bn1`` (stem), ``layer{i}.{j}.conv{n}``/``bn{n}``, ``downsample.{0,1}``, ``fc``.
        Ours: ``stem.0.{conv,bn}``, ``layers.{i-1}.{j}.conv{n}.{conv,bn}``, ``downsample.{conv,bn}``, ``fc``.
        The weighted convolution's ``den``/``Phi`` buffers (absent from torchvision) are kept from this model,
        so torchvision weights also start a ``conv_layer='weighted'`` fine-tune.
        """
        if 'conv1.weight' not in state_dict or 'layer1.0.conv1.weight' not in state_dict:
            return state_dict
        out = {}
        for k, v in state_dict.items():
            parts = k.split('.')
            if parts[0] in ('conv1', 'bn1'):                       # stem: conv1 -> stem.0.conv, bn1 -> stem.0.bn
                k = 'stem.0.' + ('conv.' if parts[0] == 'conv1' else 'bn.') + '.'.join(parts[1:])
            elif parts[0].startswith('layer'):                     # layer{i}.{j}.<name>.<param>
                stage, block, name, rest = int(parts[0][5:]) - 1, parts[1], parts[2], parts[3:]
                if name == 'downsample':                           # downsample.0 = conv, downsample.1 = bn
                    name, rest = 'downsample.' + ('conv' if rest[0] == '0' else 'bn'), rest[1:]
                elif name.startswith('bn'):                        # bn{n} -> conv{n}.bn
                    name = f'conv{name[2:]}.bn'
                else:                                              # conv{n} -> conv{n}.conv
                    name = f'{name}.conv'
                k = f'layers.{stage}.{block}.{name}.' + '.'.join(rest)
            out[k] = v
        return _keep_density_buffers(self, out)


def _keep_density_buffers(model: nn.Module, state_dict: dict) -> dict:
    """Add the model's own weighted-conv ``den``/``Phi`` buffers where a standard-conv checkpoint has none."""
    for k, v in model.state_dict().items():
        if k.rsplit('.', 1)[-1] in ('den', 'Phi') and k not in state_dict:
            state_dict[k] = v
    return state_dict


def _create(cfg: dict, kwargs: dict) -> ResNet:
    return build_model(ResNet, cfg, kwargs)


_RESNET = dict(family='resnet', paper='https://arxiv.org/abs/1512.03385', repo='https://github.com/pytorch/vision',
               capabilities=('features', 'tune_mode', 'weighted_conv'), tiny='resnet_tiny')


@register_model(**_RESNET, params=11_689_512, top1=69.758)
def resnet18(**kwargs):
    """ResNet-18 (torchvision's layout; ``stem='cifar'`` for 32x32 inputs)."""
    return _create(dict(block='basic', layers=(2, 2, 2, 2)), kwargs)


@register_model(**_RESNET, params=21_797_672, top1=73.314)
def resnet34(**kwargs):
    """ResNet-34 (torchvision's layout)."""
    return _create(dict(block='basic', layers=(3, 4, 6, 3)), kwargs)


@register_model(**_RESNET, params=25_557_032, top1=76.13)
def resnet50(**kwargs):
    """ResNet-50 v1.5 (stride on the 3x3 conv, torchvision's layout)."""
    return _create(dict(block='bottleneck', layers=(3, 4, 6, 3)), kwargs)


@register_model(**{**_RESNET, 'input_size': (3, 32, 32)})
def resnet_tiny(**kwargs):
    """A CPU-sized ResNet for tests: CIFAR stem, one basic block per stage, widths 16-128."""
    return _create(dict(block='basic', layers=(1, 1, 1, 1), widths=(16, 32, 64, 128), stem='cifar'), kwargs)
