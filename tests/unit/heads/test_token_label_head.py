"""TokenLabelClsHead (LV-ViT's token labelling): the plain classification loss without token
labels, the token loss with hard or soft labels against the cross-entropy written out, LV-ViT's
prediction once the auxiliary head has trained, one-line errors."""

import pytest
import torch
from mmpretrain.structures import DataSample

from mmrepa.errors import ConfigError, InputError
from mmrepa.heads import TokenLabelClsHead

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
