"""The models of the GPU benchmark, built in code (no downloads, no torchvision).

* ``resnet18_like``: ResNet-18's layout (7x7 stem, 4 stages of 2 basic blocks, 64-512
  channels) for the seed workload's 3x224x224 images.
* ``video3d``: a small 3-D conv net in the spirit of R3D-18 (3x7x7 stem, strided
  3x3x3 stages, 64-256 channels) for (B, 3, T, H, W) clips.

Both end in a linear classifier; ``width`` scales every channel count (the CPU stand-in
uses a tiny one).
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["resnet18_like", "video3d"]


class _Block(nn.Module):
    def __init__(
        self, cin: int, cout: int, stride: int, conv: type[nn.Module], bn: type[nn.Module]
    ) -> None:
        super().__init__()
        self.body = nn.Sequential(
            conv(cin, cout, 3, stride=stride, padding=1, bias=False),
            bn(cout),
            nn.ReLU(inplace=True),
            conv(cout, cout, 3, padding=1, bias=False),
            bn(cout),
        )
        self.skip: nn.Module = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(conv(cin, cout, 1, stride=stride, bias=False), bn(cout))
        )
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.body(x) + self.skip(x))


def resnet18_like(width: int = 64, classes: int = 1000) -> nn.Module:
    """ResNet-18's layout for (B, 3, H, W) float images."""
    w = [width, 2 * width, 4 * width, 8 * width]
    layers: list[nn.Module] = [
        nn.Conv2d(3, w[0], 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(w[0]),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    cin = w[0]
    for k, cout in enumerate(w):
        for b in range(2):
            layers.append(
                _Block(cin, cout, 2 if (b == 0 and k > 0) else 1, nn.Conv2d, nn.BatchNorm2d)
            )
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def video3d(width: int = 64, classes: int = 400) -> nn.Module:
    """A small R3D-like net for (B, 3, T, H, W) float clips."""
    w = [width, 2 * width, 4 * width]
    layers: list[nn.Module] = [
        nn.Conv3d(3, w[0], (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3), bias=False),
        nn.BatchNorm3d(w[0]),
        nn.ReLU(inplace=True),
    ]
    cin = w[0]
    for k, cout in enumerate(w):
        layers.append(_Block(cin, cout, 1 if k == 0 else 2, nn.Conv3d, nn.BatchNorm3d))
        cin = cout
    layers += [nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)
