"""VGG with interchangeable convolutions and ConvBN modes.

Paper: Simonyan & Zisserman, "Very Deep Convolutional Networks for Large-Scale Image Recognition"
(ICLR 2015, arXiv 1409.1556). Reference implementation: torchvision.models.vgg; ``vgg11``/``vgg16`` and
``vgg11_bn``/``vgg16_bn`` have torchvision's parameter counts. The weighted-convolution paper
(Cammarasana & Patanè 2025) evaluates VGG on CIFAR-100: ``stem='cifar'`` keeps the same convolutions
for 32x32 inputs (the five poolings leave 1x1) with a single linear classifier on the 512 features.

With ``batch_norm=True`` each conv is a :class:`zoo.layers.convbn.ConvBN` (torchvision keeps the conv bias
there too), so ``convbn_mode`` switches train / eval / deploy / tune.
"""
from __future__ import annotations

import torch
from torch import nn

from zoo.layers.convbn import ConvBN
from zoo.layers.weighted_conv import conv_factory

from ._builder import ClassifierBase, FeatureInfo, build_model, check_image, run_blocks, select_features
from ._registry import register_model

__all__ = ['VGG', 'CFGS']

CFGS = {  # channels per 3x3 conv, 'M' a 2x2 max-pool
    'vgg11': (64, 'M', 128, 'M', 256, 256, 'M', 512, 512, 'M', 512, 512, 'M'),
    'vgg16': (64, 64, 'M', 128, 128, 'M', 256, 256, 256, 'M', 512, 512, 512, 'M', 512, 512, 512, 'M'),
    'tiny': (16, 'M', 32, 'M', 64, 64, 'M'),
}


class VGG(ClassifierBase):
    """VGG (Simonyan & Zisserman 2015) with ``conv_layer``/``den`` and, with batch norm, ``convbn_mode``.

    ``features_only``: return the maps after the max-pools of ``out_indices`` (strides 2, 4, 8, ...) instead
    of logits; no head is built."""

    head_attr = 'fc'
    classifier_prefix = 'fc'

    def __init__(self, cfg='vgg16', num_classes: int = 1000, in_chans: int = 3, batch_norm: bool = False,
                 stem: str = 'imagenet', conv_layer='standard', den=None, trainable_den: bool = False,
                 convbn_mode: str = 'train', drop_rate: float = 0.5, features_only: bool = False, out_indices=None):
        super().__init__()
        cfg = CFGS[cfg] if isinstance(cfg, str) else tuple(cfg)
        if stem not in ('imagenet', 'cifar'):
            raise ValueError(f"stem must be 'imagenet' (224x224, 4096-wide MLP head) or 'cifar' (32x32), got {stem!r}")
        conv = conv_factory(conv_layer, den, trainable_den)
        self.in_chans, self.num_classes, self.stem_type = in_chans, num_classes, stem
        layers, chs, info = [], in_chans, []
        for v in cfg:
            if v == 'M':
                layers.append(nn.MaxPool2d(2, 2))
                info.append(FeatureInfo(chs, 2 ** (len(info) + 1), f'features.{len(layers) - 1}'))
                continue
            if batch_norm:
                layers += [ConvBN(chs, v, 3, 1, 1, bias=True, conv_layer=conv, mode=convbn_mode), nn.ReLU(inplace=True)]
            else:
                layers += [conv(chs, v, 3, padding=1), nn.ReLU(inplace=True)]
            chs = v
        self.features = nn.Sequential(*layers)
        self.min_size = 2 ** cfg.count('M')
        self.features_only = features_only
        self.out_indices, self.feature_info = select_features(info, out_indices, features_only)
        self.first_conv = 'features.0.conv' if batch_norm else 'features.0'
        self.num_features = chs  # timm's: the channels of forward_features' map
        if features_only:
            self._init_weights()
            return
        if stem == 'imagenet':  # torchvision: 7x7 average grid, two 4096-wide hidden layers
            self.pool = nn.AdaptiveAvgPool2d(7)
            self.pre_logits = nn.Sequential(nn.Linear(chs * 49, 4096), nn.ReLU(True), nn.Dropout(drop_rate),
                                            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(drop_rate))
            self.head_hidden_size = 4096
            self.pool_types = ('avg',)  # the MLP reads the 7x7 pooled grid: there is no unpooled classifier input
        else:
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.pre_logits = nn.Dropout(drop_rate)
        self.fc = nn.Linear(self.head_hidden_size, num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    # -- the stages timm's contract runs (zoo._builder.ClassifierBase): the convs up to each max-pool -------
    def _pools(self) -> list[int]:
        return [j for j, m in enumerate(self.features) if isinstance(m, nn.MaxPool2d)]

    @property
    def num_stages(self) -> int:
        return len(self._pools())

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        check_image(x, self.in_chans, self.min_size, type(self).__name__)
        return x

    def stage_blocks(self, i: int) -> list[nn.Module]:
        """The layers after max-pool ``i - 1`` up to max-pool ``i``: the map (B, C_i, H/2^(i+1), W/2^(i+1))."""
        pools = self._pools()
        return list(self.features[(pools[i - 1] + 1 if i else 0):pools[i] + 1])

    def forward_stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return run_blocks(self.stage_blocks(i), x, self._checkpointing())

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return run_blocks(self.features, self.forward_stem(x), self._checkpointing())  # with layers after a pool

    def truncate_stages(self, n: int) -> None:
        self.features = self.features[:self._pools()[n - 1] + 1]

    def group_matcher(self, coarse: bool = False) -> dict:
        return {'stem': r'^features\.0\.', 'blocks': r'^features\.(\d+)\.'}  # timm's VGG: one group per layer

    def set_global_pool(self, global_pool: str, num_classes: int) -> None:
        if global_pool == '' and self.stem_type == 'imagenet':
            raise ValueError("VGG with stem='imagenet': its 4096-wide MLP reads the 7x7 average-pooled map, so there "
                             "is no unpooled head (global_pool=''); forward_features gives the unpooled map")
        super().set_global_pool(global_pool, num_classes)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if not self.global_pool:  # global_pool='': the unpooled maps
            return x
        x = self.pre_logits(self.pool(x).flatten(1))  # (B, C, h, w) -> (B, C * h * w) -> (B, head_hidden_size)
        return x if pre_logits else self.fc(x)

    def remap_checkpoint(self, state_dict: dict) -> dict:
        """Map torchvision's VGG layout onto ours (ours is returned unchanged).

        torchvision's ``features`` is conv, [bn,] relu per conv and a max-pool per 'M'; ours is conv (or one
        ConvBN holding ``conv`` and ``bn``), relu. Its ``classifier.{0,3,6}`` are our ``pre_logits.{0,3}`` and
        ``fc`` (the 224x224 head; ``stem='cifar'`` has no torchvision counterpart). The weighted convolution's
        ``den``/``Phi`` buffers are kept from this model.
        """
        if 'classifier.6.weight' not in state_dict:
            return state_dict
        names, tv = {}, 0                        # torchvision's features.<tv> -> our features.<i>[.conv|.bn]
        for i, m in enumerate(self.features):
            if isinstance(m, ConvBN):
                names[str(tv)], names[str(tv + 1)] = f'{i}.conv', f'{i}.bn'
                tv += 2
            else:                                # a conv (same index), ReLU or max-pool
                names[str(tv)] = str(i)
                tv += 1
        head = {'0': 'pre_logits.0', '3': 'pre_logits.3', '6': 'fc'}
        out = {}
        for k, v in state_dict.items():
            group, idx, param = k.split('.', 2)
            if group == 'features' and idx in names:
                k = f'features.{names[idx]}.{param}'
            elif group == 'classifier' and idx in head:
                k = f'{head[idx]}.{param}'
            out[k] = v
        for k, v in self.state_dict().items():  # weighted-conv buffers absent from torchvision
            if k.rsplit('.', 1)[-1] in ('den', 'Phi') and k not in out:
                out[k] = v
        return out


def _create(cfg: dict, kwargs: dict) -> VGG:
    return build_model(VGG, cfg, kwargs)


_VGG = dict(family='vgg', paper='https://arxiv.org/abs/1409.1556', repo='https://github.com/pytorch/vision',
            capabilities=('features', 'weighted_conv'), tiny='vgg_tiny')
_VGG_BN = {**_VGG, 'capabilities': ('features', 'weighted_conv', 'tune_mode')}


@register_model(**_VGG, params=132_863_336, top1=69.02)
def vgg11(**kwargs):
    """VGG-11 (configuration A), torchvision's layout."""
    return _create(dict(cfg='vgg11'), kwargs)


@register_model(**_VGG_BN, params=132_868_840, top1=70.37)
def vgg11_bn(**kwargs):
    """VGG-11 with batch norm (ConvBN blocks), torchvision's layout."""
    return _create(dict(cfg='vgg11', batch_norm=True), kwargs)


@register_model(**_VGG, params=138_357_544, top1=71.592)
def vgg16(**kwargs):
    """VGG-16 (configuration D), torchvision's layout."""
    return _create(dict(cfg='vgg16'), kwargs)


@register_model(**_VGG_BN, params=138_365_992, top1=73.36)
def vgg16_bn(**kwargs):
    """VGG-16 with batch norm (ConvBN blocks), torchvision's layout."""
    return _create(dict(cfg='vgg16', batch_norm=True), kwargs)


@register_model(**{**_VGG_BN, 'input_size': (3, 32, 32)})
def vgg_tiny(**kwargs):
    """A CPU-sized VGG with batch norm for tests: 4 convs (16-64 channels), CIFAR head."""
    return _create(dict(cfg='tiny', batch_norm=True, stem='cifar'), kwargs)
