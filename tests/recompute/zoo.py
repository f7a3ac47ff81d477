"""Real architectures for the recompute sweep: every torchvision classification model and ten
Hugging Face families, each built small (its own classes, blocks and code paths; fewer and
narrower layers where the builder fixes widths), with its batches and its loss."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
import torchvision.models as tv
from torch import nn
from torchvision.models import (
    convnext,
    densenet,
    efficientnet,
    maxvit,
    regnet,
    resnet,
    swin_transformer,
    vgg,
    vision_transformer,
)

from tests.recompute.sweep import Workload

CLASSES = 10


def _small_classifier(features: int) -> nn.Sequential:
    """AlexNet's and VGG's classifier (linear, ReLU, dropout twice, then linear), 64 wide."""
    return nn.Sequential(
        nn.Dropout(),
        nn.Linear(features, 64),
        nn.ReLU(inplace=True),
        nn.Dropout(),
        nn.Linear(64, 64),
        nn.ReLU(inplace=True),
        nn.Linear(64, CLASSES),
    )


def _alexnet() -> nn.Module:
    model = tv.alexnet(num_classes=CLASSES)
    model.classifier = _small_classifier(256 * 6 * 6)
    return model


def _vgg(config: str, batch_norm: bool) -> nn.Module:
    layers = [item if item == "M" else max(4, int(item) // 16) for item in vgg.cfgs[config]]
    model = vgg.VGG(vgg.make_layers(layers, batch_norm=batch_norm), num_classes=CLASSES)
    model.classifier = nn.Sequential(*list(_small_classifier(32 * 7 * 7))[1:])
    return model


def _resnet(block: type[nn.Module], groups: int = 1, width: int = 16) -> nn.Module:
    return resnet.ResNet(block, [1, 1, 1, 1], num_classes=CLASSES, groups=groups, width_per_group=width)  # type: ignore[arg-type]


def _densenet(growth: int, initial: int) -> nn.Module:
    return densenet.DenseNet(growth, (2, 2, 2), initial, bn_size=2, num_classes=CLASSES)


def _efficientnet(width: float, dropout: float) -> nn.Module:
    settings = [
        efficientnet.MBConvConfig(1, 3, 1, 16, 8, 1, width_mult=width),
        efficientnet.MBConvConfig(6, 3, 2, 8, 12, 2, width_mult=width),
        efficientnet.MBConvConfig(6, 5, 2, 12, 20, 1, width_mult=width),
    ]
    return efficientnet.EfficientNet(settings, dropout, num_classes=CLASSES)


def _efficientnet_v2(layers: int) -> nn.Module:
    settings: list[Any] = [
        efficientnet.FusedMBConvConfig(1, 3, 1, 8, 8, layers),
        efficientnet.FusedMBConvConfig(4, 3, 2, 8, 16, layers),
        efficientnet.MBConvConfig(4, 3, 2, 16, 24, layers),
    ]
    norm = partial(nn.BatchNorm2d, eps=1e-03)
    return efficientnet.EfficientNet(settings, 0.2, num_classes=CLASSES, norm_layer=norm, last_channel=64)


def _regnet(se_ratio: float | None) -> nn.Module:
    params = regnet.BlockParams.from_init_params(
        depth=4, w_0=8, w_a=8.0, w_m=2.0, group_width=8, se_ratio=se_ratio
    )
    return regnet.RegNet(params, num_classes=CLASSES, stem_width=8)


def _swin(version: int) -> nn.Module:
    extra: dict[str, Any] = (
        {}
        if version == 1
        else {
            "block": swin_transformer.SwinTransformerBlockV2,
            "downsample_layer": swin_transformer.PatchMergingV2,
        }
    )
    return swin_transformer.SwinTransformer(
        patch_size=[4, 4],
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=[2, 2],
        stochastic_depth_prob=0.2,
        num_classes=CLASSES,
        **extra,
    )


def _vit(dropout: float) -> nn.Module:
    return vision_transformer.VisionTransformer(
        image_size=32,
        patch_size=8,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        mlp_dim=64,
        dropout=dropout,
        num_classes=CLASSES,
    )


def _convnext() -> nn.Module:
    settings = [convnext.CNBlockConfig(16, 32, 1), convnext.CNBlockConfig(32, None, 1)]
    return convnext.ConvNeXt(settings, stochastic_depth_prob=0.1, num_classes=CLASSES)


def _maxvit() -> nn.Module:
    return maxvit.MaxVit(
        input_size=(32, 32),
        stem_channels=8,
        partition_size=2,
        block_channels=[16, 32],
        block_layers=[1, 1],
        head_dim=8,
        stochastic_depth_prob=0.2,
        num_classes=CLASSES,
    )


def _builder(name: str, **options: Any) -> Callable[[], nn.Module]:
    return lambda: tv.get_model(name, num_classes=CLASSES, **options)


_EFFICIENTNET_WIDTHS = {
    "b0": 1.0,
    "b1": 1.0,
    "b2": 1.1,
    "b3": 1.2,
    "b4": 1.4,
    "b5": 1.6,
    "b6": 1.8,
    "b7": 2.0,
}

#: Each torchvision classification builder's name -> a small model of its architecture.
TORCHVISION: dict[str, Callable[[], nn.Module]] = {
    "alexnet": _alexnet,
    **{f"convnext_{size}": _convnext for size in ("tiny", "small", "base", "large")},
    "densenet121": partial(_densenet, 8, 16),
    "densenet161": partial(_densenet, 12, 24),
    "densenet169": partial(_densenet, 8, 16),
    "densenet201": partial(_densenet, 8, 16),
    **{
        f"efficientnet_{variant}": partial(_efficientnet, width * 0.5, 0.2 + 0.05 * index)
        for index, (variant, width) in enumerate(_EFFICIENTNET_WIDTHS.items())
    },
    "efficientnet_v2_s": partial(_efficientnet_v2, 1),
    "efficientnet_v2_m": partial(_efficientnet_v2, 2),
    "efficientnet_v2_l": partial(_efficientnet_v2, 2),
    "googlenet": _builder("googlenet", aux_logits=False, init_weights=False),
    "inception_v3": _builder("inception_v3", aux_logits=False, init_weights=False),
    "maxvit_t": _maxvit,
    **{name: _builder(name) for name in ("mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3")},
    "mobilenet_v2": _builder("mobilenet_v2", width_mult=0.5),
    "mobilenet_v3_large": _builder("mobilenet_v3_large", width_mult=0.5),
    "mobilenet_v3_small": _builder("mobilenet_v3_small", width_mult=0.5),
    **{
        f"regnet_{kind}_{size}": partial(_regnet, None if kind == "x" else 0.25)
        for kind in ("x", "y")
        for size in ("400mf", "800mf", "1_6gf", "3_2gf", "8gf", "16gf", "32gf")
    },
    "regnet_y_128gf": partial(_regnet, 0.25),
    "resnet18": partial(_resnet, resnet.BasicBlock, width=64),
    "resnet34": partial(_resnet, resnet.BasicBlock, width=64),
    "resnet50": partial(_resnet, resnet.Bottleneck),
    "resnet101": partial(_resnet, resnet.Bottleneck),
    "resnet152": partial(_resnet, resnet.Bottleneck),
    "resnext50_32x4d": partial(_resnet, resnet.Bottleneck, groups=4, width=4),
    "resnext101_32x8d": partial(_resnet, resnet.Bottleneck, groups=4, width=8),
    "resnext101_64x4d": partial(_resnet, resnet.Bottleneck, groups=8, width=4),
    "wide_resnet50_2": partial(_resnet, resnet.Bottleneck, width=32),
    "wide_resnet101_2": partial(_resnet, resnet.Bottleneck, width=32),
    **{name: _builder(name) for name in ("shufflenet_v2_x0_5", "shufflenet_v2_x1_0")},
    "shufflenet_v2_x1_5": _builder("shufflenet_v2_x1_5"),
    "shufflenet_v2_x2_0": _builder("shufflenet_v2_x2_0"),
    "squeezenet1_0": _builder("squeezenet1_0"),
    "squeezenet1_1": _builder("squeezenet1_1"),
    **{f"swin_{size}": partial(_swin, 1) for size in ("t", "s", "b")},
    **{f"swin_v2_{size}": partial(_swin, 2) for size in ("t", "s", "b")},
    **{
        f"vgg{depth}{suffix}": partial(_vgg, config, suffix == "_bn")
        for depth, config in (("11", "A"), ("13", "B"), ("16", "D"), ("19", "E"))
        for suffix in ("", "_bn")
    },
    **{f"vit_{size}": partial(_vit, 0.1) for size in ("b_16", "b_32", "l_16", "l_32", "h_14")},
}

#: Input side per builder that needs more than 32 pixels.
_IMAGE_SIDE = {
    "alexnet": 64,
    "googlenet": 64,
    "inception_v3": 75,
    "mobilenet_v2": 64,
    "squeezenet1_0": 48,
    "squeezenet1_1": 48,
}


def torchvision_workload(name: str) -> Workload:
    side = _IMAGE_SIDE.get(name, 32)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(step)
        return torch.randn(2, 3, side, side, generator=generator), torch.randint(
            0, CLASSES, (2,), generator=generator
        )

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch[0]), batch[1])

    return Workload(TORCHVISION[name], batch, loss)


# -- Hugging Face -------------------------------------------------------------------------

_VOCAB, _LENGTH, _HIDDEN = 96, 12, 32
_SMALL = {"hidden_size": _HIDDEN, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": _VOCAB}


def _decoder(config_name: str, model_name: str, **options: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        config = getattr(transformers, config_name)(**options)
        return getattr(transformers, model_name)(config)

    return build


def _llama_like(config_name: str, model_name: str, **options: Any) -> Callable[[], nn.Module]:
    return _decoder(
        config_name,
        model_name,
        num_hidden_layers=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **_SMALL,
        **options,
    )


_ENCODER_DECODER = {
    "use_cache": False,
    "d_model": _HIDDEN,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "vocab_size": _VOCAB,
}

#: Each Hugging Face family -> a small model of it and the kind of its batches. GPT-2 keeps the
#: library's default key/value cache in training (its blocks are then excluded, with the reason);
#: the others train with ``use_cache=False``, as is usual, and recompute their blocks.
HUGGING_FACE: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "gpt2": (
        _decoder("GPT2Config", "GPT2LMHeadModel", n_embd=_HIDDEN, n_layer=2, n_head=4, vocab_size=_VOCAB),
        "causal",
    ),
    "bert": (_decoder("BertConfig", "BertForMaskedLM", num_hidden_layers=2, **_SMALL), "masked"),
    "llama": (_llama_like("LlamaConfig", "LlamaForCausalLM"), "causal"),
    "mistral": (_llama_like("MistralConfig", "MistralForCausalLM", sliding_window=8), "causal"),
    "qwen2": (_llama_like("Qwen2Config", "Qwen2ForCausalLM"), "causal"),
    "gpt_neox": (
        _decoder("GPTNeoXConfig", "GPTNeoXForCausalLM", use_cache=False, num_hidden_layers=2, **_SMALL),
        "causal",
    ),
    "t5": (
        _decoder(
            "T5Config",
            "T5ForConditionalGeneration",
            use_cache=False,
            decoder_start_token_id=0,
            pad_token_id=0,
            d_model=_HIDDEN,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            vocab_size=_VOCAB,
        ),
        "seq2seq",
    ),
    "bart": (
        _decoder(
            "BartConfig",
            "BartForConditionalGeneration",
            **_ENCODER_DECODER,
            max_position_embeddings=64,
        ),
        "seq2seq",
    ),
    "whisper": (
        _decoder(
            "WhisperConfig",
            "WhisperForConditionalGeneration",
            **_ENCODER_DECODER,
            num_mel_bins=8,
            max_source_positions=16,
            max_target_positions=32,
            decoder_start_token_id=1,
            pad_token_id=0,
        ),
        "speech",
    ),
    "vit": (
        _decoder(
            "ViTConfig",
            "ViTForImageClassification",
            image_size=32,
            patch_size=8,
            num_hidden_layers=2,
            num_labels=CLASSES,
            **_SMALL,
        ),
        "image",
    ),
}


def hugging_face_workload(name: str) -> Workload:
    build, kind = HUGGING_FACE[name]

    def batch(step: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(step)
        tokens = torch.randint(2, _VOCAB, (2, _LENGTH), generator=generator)
        if kind in ("causal", "masked"):
            return {"input_ids": tokens, "labels": tokens}
        if kind == "seq2seq":
            return {
                "input_ids": tokens,
                "labels": torch.randint(2, _VOCAB, (2, _LENGTH // 2), generator=generator),
            }
        if kind == "speech":
            features = torch.randn(2, 8, 32, generator=generator)
            return {"input_features": features, "labels": tokens[:, : _LENGTH // 2]}
        pixels = torch.randn(2, 3, 32, 32, generator=generator)
        return {"pixel_values": pixels, "labels": torch.randint(0, CLASSES, (2,), generator=generator)}

    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(**batch).loss

    return Workload(build, batch, loss)
