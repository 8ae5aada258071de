"""TokenLabelClsHead (LV-ViT's token labelling): the plain classification loss without token
labels, the token loss with hard or soft labels against the cross-entropy written out, LV-ViT's
prediction once the auxiliary head has trained, MixToken's mixed class target (and a training
step of the RePa-LV-ViT config with it), one-line errors."""

import pytest
import torch
from mmpretrain.structures import DataSample

from mmrepa.errors import ConfigError, InputError
from mmrepa.heads import TokenLabelClsHead
from mmrepa.layers import MixedTokens, TokenBox

B, H, W, C, K = 2, 2, 3, 8, 5


def _head(**kw):
    return TokenLabelClsHead(num_classes=K, in_channels=C, **kw)


def _tokens():
    return (torch.randn(B, 1 + H * W, C, dtype=torch.float64),)


def _samples(token_labels=None):
    samples = [DataSample().set_gt_label(label) for label in (1, 3)]
    for sample, label in zip(samples, token_labels if token_labels is not None else []):
        sample.gt_token_label = label
    return samples


def _ce(logits, probs):
    """Cross-entropy against class probabilities, written out."""
    return -(probs * (logits - logits.exp().sum(-1, keepdim=True).log())).sum(-1)


def test_without_token_labels_the_loss_is_the_class_tokens():
    head = _head().double()
    feats = _tokens()
    losses = head.loss(feats, _samples())
    cls = feats[0][:, 0] @ head.fc.weight.T + head.fc.bias
    expected = _ce(cls, torch.eye(K, dtype=torch.float64)[[1, 3]]).mean()
    assert set(losses) == {'loss'}
    torch.testing.assert_close(losses['loss'], expected)
    losses['loss'].backward()
    assert head.aux_fc.weight.grad is not None  # in the graph (DDP), with weight 0
    assert not head.aux_fc.weight.grad.any()
    assert not head.aux_trained
    torch.testing.assert_close(head(feats), cls)  # the untrained auxiliary head left out


@pytest.mark.parametrize('soft', [False, True])
def test_token_labels_add_the_token_loss_and_lvvits_prediction(soft):
    head = _head(aux_weight=0.7).double()
    feats = _tokens()
    hard = torch.randint(0, K, (B, H, W))
    if soft:
        labels = torch.rand(B, K, H, W, dtype=torch.float64).softmax(1)
        probs = labels.permute(0, 2, 3, 1).reshape(B, H * W, K)
    else:
        labels = hard
        probs = torch.eye(K, dtype=torch.float64)[hard.reshape(B, H * W)]
    losses = head.loss(feats, _samples(list(labels)))
    patches = feats[0][:, 1:] @ head.aux_fc.weight.T + head.aux_fc.bias  # (B, H·W, K)
    torch.testing.assert_close(losses['loss_token'], 0.7 * _ce(patches, probs).mean())
    assert head.aux_trained
    cls = feats[0][:, 0] @ head.fc.weight.T + head.fc.bias
    torch.testing.assert_close(head(feats), cls + 0.5 * patches.max(dim=1).values)


def test_bad_token_labels_are_refused_in_one_line():
    head = _head()
    feats = tuple(f.float() for f in _tokens())
    partial = _samples([torch.zeros(H, W, dtype=torch.long)])
    wrong_grid = _samples([torch.zeros(H, H, dtype=torch.long)] * 2)
    mixed = _samples([torch.zeros(H, W, dtype=torch.long)] * 2)
    for sample in mixed:
        sample.set_gt_score(torch.full((K,), 1.0 / K))
    for samples, error, words in (
        (partial, InputError, '1 of 2 samples'),
        (wrong_grid, InputError, '2 x 2 grid'),
        (mixed, ConfigError, 'train_cfg.augments'),
    ):
        with pytest.raises(error, match=words) as e:
            head.loss(feats, samples)
        assert '\n' not in str(e.value)
    with pytest.raises(ConfigError, match="out_type='raw'"):
        head.loss((feats[0][:, 0],), _samples())


def _onehot(labels):
    return torch.eye(K, dtype=torch.float64)[labels]


@pytest.mark.parametrize('token_labels', [False, True])
def test_mixtoken_mixes_the_class_target_by_the_box_area_and_leaves_token_labels(token_labels):
    """A box of 2 of the 6 tokens: the class target is 4/6 of the image's label and 2/6 of the
    flipped batch's, smoothed after mixing (LabelSmoothLoss, as the configs); the token labels
    are each token's own."""
    smooth = dict(type='mmpretrain.LabelSmoothLoss', label_smooth_val=0.1, mode='original')
    head = _head(loss=smooth).double()
    tokens = _tokens()[0]
    box = TokenBox(top=1, bottom=2, left=0, right=2, grid=(H, W))
    hard = torch.randint(0, K, (B, H, W))
    samples = _samples(list(hard) if token_labels else None)
    losses = head.loss(MixedTokens((tokens,), box), samples)
    lam = 1 - 2 / 6
    mixed = lam * _onehot([1, 3]) + (1 - lam) * _onehot([3, 1])
    cls = tokens[:, 0] @ head.fc.weight.T + head.fc.bias
    torch.testing.assert_close(losses['loss'], _ce(cls, 0.9 * mixed + 0.1 / K).mean())
    if token_labels:
        patches = tokens[:, 1:] @ head.aux_fc.weight.T + head.aux_fc.bias
        own = _onehot(hard.reshape(B, H * W))
        torch.testing.assert_close(losses['loss_token'], _ce(patches, own).mean())
    # an empty box is no mixing: the plain loss
    empty = TokenBox(top=1, bottom=1, left=0, right=2, grid=(H, W))
    plain = head.loss((tokens,), _samples())['loss']
    torch.testing.assert_close(head.loss(MixedTokens((tokens,), empty), _samples())['loss'], plain)


def test_mixtoken_with_mixup_or_accuracy_is_refused_in_one_line():
    feats = MixedTokens(_tokens(), TokenBox(0, 1, 0, 1, (H, W)))
    mixup = _samples()
    for sample in mixup:
        sample.set_gt_score(torch.full((K,), 1.0 / K))
    for head, samples, words in (
        (_head().double(), mixup, 'train_cfg.augments'),
        (_head(cal_acc=True).double(), _samples(), 'cal_acc=False'),
    ):
        with pytest.raises(ConfigError, match=words) as e:
            head.loss(feats, samples)
        assert '\n' not in str(e.value)


def test_a_training_step_of_the_lvvit_config_mixes_tokens(monkeypatch):
    """repa_lvvit_s's ImageClassifier (tiny widths) runs a training step with MixToken: the
    box reaches the head through mmpretrain's classifier."""
    from mmengine.config import Config
    from mmengine.optim import OptimWrapper

    from mmrepa.apis import build_model
    from tests.helpers import ROOT

    cfg = Config.fromfile(f'{ROOT}/configs/repa_vit/repa_lvvit_s_8xb128_in1k.py')
    cfg.model.backbone.update(arch=dict(embed_dims=16, num_layers=2, num_heads=2), stem_channels=8)
    cfg.model.head.update(in_channels=16, num_classes=K)
    model = build_model(cfg)
    seen = []
    mixed_loss = TokenLabelClsHead._mixed_loss

    def spy(self, cls_score, data_samples, box, **kw):
        seen.append(box)
        return mixed_loss(self, cls_score, data_samples, box, **kw)

    monkeypatch.setattr(TokenLabelClsHead, '_mixed_loss', spy)
    data = dict(
        inputs=[torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)] * 2,
        data_samples=_samples(),
    )
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    torch.manual_seed(0)
    log = model.train_step(data, optim)
    assert torch.isfinite(log['loss']) and len(seen) == 1 and seen[0].grid == (4, 4)
