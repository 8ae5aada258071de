"""Exact two-stage post-processing for ONNX Runtime and OpenVINO exports (mmdet's own
semantics).

mmdeploy 1.3.1 rewrites the RPN's and the R-CNN head's post-processing for export, and both
rewrites change what mmdet computes. On the demo Mask R-CNN 11 of 80 validation images came out
different (other detections, boxes off by up to 76 px, masks with IoU 0). For the
``onnxruntime`` backend the two rewrites below take precedence over mmdeploy's and keep mmdet's
results, in standard ONNX ops (``NonMaxSuppression``, ``TopK``).

RPN. mmdet keeps each level's ``nms_pre`` best anchors, drops boxes not larger than
``min_bbox_size``, runs NMS *per level* (``batched_nms`` over level ids) and keeps the
``max_per_img`` best proposals, with no score threshold. mmdeploy runs one NMS across levels,
drops proposals scoring under its ``score_threshold`` (0.05) and keeps no size check. Below, the
levels play the part of classes: proposal i is scored in its own level's column only (the other
columns and too-small boxes get -1, under a threshold of -0.5 that every sigmoid or softmax
score passes), so ``NonMaxSuppression`` runs per level, as mmdet.

RetinaNet. mmdet keeps, per level, the ``nms_pre`` best (anchor, class) pairs scoring above
``score_thr``, drops boxes not larger than ``min_bbox_size`` (0: boxes clipped to no width or
height), runs NMS per class and keeps ``max_per_img``. mmdeploy's rewrite of
``BaseDenseHead.predict_by_feat`` keeps the ``nms_pre`` best anchors by their best class instead
and has no size check, so a RetinaNet whose regression pushes boxes out of the image (common in
early training) gets degenerate boxes mmdet drops. The rewrite below is keyed on ``RetinaHead``
(the single-stage head of mmrepa's configs; other heads keep mmdeploy's rewrite) and computes
mmdet's candidates.

R-CNN. mmdeploy 1.3.1's rewrite of ``BBoxHead.predict_by_feat`` gives every class of an RoI the box
regressed for the RoI's highest-scoring class. With class-specific regression (mmdet's default,
``reg_class_agnostic=False``) a detection of another class then gets a box that is not the one
mmdet returns: on the demo Mask R-CNN two of six detections moved by up to 0.9 px, and their
masks with them. Registered for the ``onnxruntime`` backend, the rewrite below keeps each
class's own box: the N RoIs become N x C candidate boxes, each scored for its own class only
(zero for the others, which the score threshold removes), so ONNX ``NonMaxSuppression`` runs per
class on exactly the boxes mmdet's ``multiclass_nms`` sees. Neither does it cut the candidates
to mmdeploy's ``pre_top_k`` (mmdet has no such cut), and a class keeps up to ``max_per_img``
boxes, as many as the image may have at all.

The body imports mmdet and mmdeploy's mmdet codebase when it runs (an export of a two-stage
detector), not when :mod:`mmrepa.integrations.mmdeploy` is imported.
"""

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from mmdeploy.core import FUNCTION_REWRITER

from .rewriters import for_backends


@for_backends(
    FUNCTION_REWRITER.register_rewriter,
    'mmdet.models.roi_heads.bbox_heads.bbox_head.BBoxHead.predict_by_feat',
)
def bbox_head__predict_by_feat__onnxruntime(
    self,
    rois: torch.Tensor,
    cls_scores: torch.Tensor,
    bbox_preds: Optional[torch.Tensor],
    batch_img_metas: List[dict],
    rcnn_test_cfg=None,
    rescale: bool = False,
) -> Tuple[torch.Tensor]:
    """Batched (B, N, ...) ``rois``, ``cls_scores``, ``bbox_preds`` -> ``dets`` (B, K, 5) in
    the network input's coordinates and ``labels`` (B, K), as mmdeploy's rewrite returns."""
    from mmdeploy.codebase.mmdet.deploy import get_post_processing_params
    from mmdeploy.mmcv.ops import multiclass_nms
    from mmdet.structures.bbox import get_box_tensor

    ctx = FUNCTION_REWRITER.get_context()
    if rois.ndim != 3:
        raise ValueError('the R-CNN head exports with a batch dimension: rois must be (B, N, 5)')
    img_shape = batch_img_metas[0]['img_shape']
    if self.custom_cls_channels:
        scores = self.loss_cls.get_activation(cls_scores)
    else:
        scores = F.softmax(cls_scores, dim=-1)
    if bbox_preds is not None:
        bboxes = get_box_tensor(
            self.bbox_coder.decode(rois[..., 1:], bbox_preds, max_shape=img_shape)
        )
    else:  # the RoIs themselves, clipped to the image (as mmdet)
        bboxes = rois[..., 1:]
        limit = bboxes.new_tensor([img_shape[1], img_shape[0]] * 2)
        bboxes = torch.min(bboxes.clamp(min=0), limit)
    B, C = scores.shape[0], self.num_classes
    scores = scores[..., :C]  # the background column goes
    if bbox_preds is not None and not self.reg_class_agnostic:
        # (B, N, C * 4) -> (B, N * C, 4): candidate n * C + c is RoI n's box for class c,
        # scored for class c alone
        bboxes = bboxes.reshape(B, -1, self.bbox_coder.encode_size)
        one_hot = torch.eye(C, dtype=scores.dtype, device=scores.device)
        scores = (scores.unsqueeze(-1) * one_hot).reshape(B, -1, C)

    post_params = get_post_processing_params(ctx.cfg)
    cfg = rcnn_test_cfg
    keep_top_k = cfg.get('max_per_img', post_params.keep_top_k)
    per_class = keep_top_k if keep_top_k > 0 else post_params.max_output_boxes_per_class
    return multiclass_nms(
        bboxes,
        scores,
        per_class,
        nms_type=cfg.nms.get('type'),
        iou_threshold=cfg.nms.get('iou_threshold', post_params.iou_threshold),
        score_threshold=cfg.get('score_thr', post_params.score_threshold),
        pre_top_k=-1,
        keep_top_k=keep_top_k,
    )


# below every sigmoid / softmax score: marks the boxes a level's or class's NMS must not see
_NOT_CANDIDATE = -1.0


@for_backends(
    FUNCTION_REWRITER.register_rewriter,
    'mmdet.models.dense_heads.rpn_head.RPNHead.predict_by_feat',
)
def rpn_head__predict_by_feat__onnxruntime(
    self,
    cls_scores: List[torch.Tensor],
    bbox_preds: List[torch.Tensor],
    score_factors=None,
    batch_img_metas: Optional[List[dict]] = None,
    cfg=None,
    rescale: bool = False,
    with_nms: bool = True,
    **kwargs,
):
    """Per-level maps -> proposals ``dets`` (B, K, 5) (x1, y1, x2, y2, objectness) and their
    level (B, K), as mmdeploy's rewrite returns them to its RoI head rewrite."""
    from mmdeploy.mmcv.ops import multiclass_nms
    from mmdet.structures.bbox import get_box_tensor

    if not with_nms:
        raise NotImplementedError('the RPN exports with NMS only')
    cfg = self.test_cfg if cfg is None else cfg
    B, levels = cls_scores[0].shape[0], len(cls_scores)
    img_shape = batch_img_metas[0]['img_shape']
    nms_pre = cfg.get('nms_pre', -1)
    priors = self.prior_generator.grid_priors(
        [score.shape[-2:] for score in cls_scores],
        dtype=bbox_preds[0].dtype,
        device=bbox_preds[0].device,
    )
    all_deltas, all_priors, all_scores, all_levels = [], [], [], []
    for level, (score, deltas, prior) in enumerate(zip(cls_scores, bbox_preds, priors)):
        score = score.permute(0, 2, 3, 1).reshape(B, -1, self.cls_out_channels)
        score = score.sigmoid()[..., 0] if self.use_sigmoid_cls else score.softmax(-1)[..., 0]
        deltas = deltas.permute(0, 2, 3, 1).reshape(B, -1, self.bbox_coder.encode_size)
        prior = get_box_tensor(prior).unsqueeze(0).expand(B, -1, -1)
        if 0 < nms_pre < score.shape[1]:
            score, keep = score.topk(nms_pre, dim=1)
            deltas = deltas.gather(1, keep.unsqueeze(-1).expand(-1, -1, deltas.shape[-1]))
            prior = prior.gather(1, keep.unsqueeze(-1).expand(-1, -1, prior.shape[-1]))
        all_deltas.append(deltas)
        all_priors.append(prior)
        all_scores.append(score)
        all_levels.append(torch.full(score.shape, level, dtype=torch.long, device=score.device))
    boxes = get_box_tensor(
        self.bbox_coder.decode(
            torch.cat(all_priors, 1), torch.cat(all_deltas, 1), max_shape=img_shape
        )
    )
    scores, level_ids = torch.cat(all_scores, 1), torch.cat(all_levels, 1)
    scores = _drop_small(boxes, scores, cfg.get('min_bbox_size', -1))
    keep_top_k = cfg.get('max_per_img', -1)
    return multiclass_nms(
        boxes,
        _per_column(scores, level_ids, levels),  # NMS per level
        keep_top_k if keep_top_k > 0 else boxes.shape[1],
        nms_type=cfg.nms.get('type'),
        iou_threshold=cfg.nms.get('iou_threshold'),
        score_threshold=_NOT_CANDIDATE / 2,
        pre_top_k=-1,
        keep_top_k=keep_top_k,
    )


def _drop_small(boxes: torch.Tensor, scores: torch.Tensor, min_size: float) -> torch.Tensor:
    """``scores`` with the boxes not larger than ``min_size`` in width or height marked as
    no candidate (mmdet's ``min_bbox_size``; a negative size checks nothing)."""
    if min_size < 0:
        return scores
    w, h = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
    return torch.where((w > min_size) & (h > min_size), scores, scores.new_full((), _NOT_CANDIDATE))


def _per_column(scores: torch.Tensor, column: torch.Tensor, columns: int) -> torch.Tensor:
    """(B, M) scores of candidates that belong to ``column`` (B, M) -> (B, M, columns), each
    scored in its own column only, so that NMS runs per column (class, or RPN level)."""
    own = column.unsqueeze(-1) == torch.arange(columns, device=scores.device)
    return torch.where(own, scores.unsqueeze(-1), scores.new_full((), _NOT_CANDIDATE))


@for_backends(
    FUNCTION_REWRITER.register_rewriter,
    'mmdet.models.dense_heads.retina_head.RetinaHead.predict_by_feat',
)
def retina_head__predict_by_feat__onnxruntime(
    self,
    cls_scores: List[torch.Tensor],
    bbox_preds: List[torch.Tensor],
    score_factors=None,
    batch_img_metas: Optional[List[dict]] = None,
    cfg=None,
    rescale: bool = False,
    with_nms: bool = True,
    **kwargs,
):
    """Per-level maps -> ``dets`` (B, K, 5) and ``labels`` (B, K) with mmdet's candidates."""
    from mmdeploy.mmcv.ops import multiclass_nms
    from mmdet.structures.bbox import get_box_tensor

    if not with_nms or score_factors is not None:
        raise NotImplementedError('RetinaHead exports with NMS and without score factors')
    cfg = self.test_cfg if cfg is None else cfg
    B, C = cls_scores[0].shape[0], self.cls_out_channels
    num_classes = self.num_classes
    img_shape = batch_img_metas[0]['img_shape']
    nms_pre, score_thr = cfg.get('nms_pre', -1), cfg.get('score_thr', 0)
    priors = self.prior_generator.grid_priors(
        [score.shape[-2:] for score in cls_scores],
        dtype=bbox_preds[0].dtype,
        device=bbox_preds[0].device,
    )
    all_boxes, all_scores, all_labels = [], [], []
    for score, deltas, prior in zip(cls_scores, bbox_preds, priors):
        score = score.permute(0, 2, 3, 1).reshape(B, -1, C)
        score = score.sigmoid() if self.use_sigmoid_cls else score.softmax(-1)[..., :-1]
        deltas = deltas.permute(0, 2, 3, 1).reshape(B, -1, self.bbox_coder.encode_size)
        prior = get_box_tensor(prior).unsqueeze(0).expand(B, -1, -1)
        # (anchor, class) pairs above the threshold, the nms_pre best of them
        score = score.reshape(B, -1)
        score = torch.where(score > score_thr, score, score.new_full((), _NOT_CANDIDATE))
        if 0 < nms_pre < score.shape[1]:
            score, pair = score.topk(nms_pre, dim=1)
        else:
            pair = torch.arange(score.shape[1], device=score.device).expand(B, -1)
        anchor = torch.div(pair, num_classes, rounding_mode='floor')
        index = anchor.unsqueeze(-1).expand(-1, -1, 4)
        boxes = self.bbox_coder.decode(
            prior.gather(1, index), deltas.gather(1, index), max_shape=img_shape
        )
        all_boxes.append(get_box_tensor(boxes))
        all_scores.append(score)
        all_labels.append(pair - anchor * num_classes)
    boxes = torch.cat(all_boxes, 1)
    scores = _drop_small(boxes, torch.cat(all_scores, 1), cfg.get('min_bbox_size', -1))
    keep_top_k = cfg.get('max_per_img', -1)
    return multiclass_nms(
        boxes,
        _per_column(scores, torch.cat(all_labels, 1), num_classes),
        keep_top_k if keep_top_k > 0 else boxes.shape[1],
        nms_type=cfg.nms.get('type'),
        iou_threshold=cfg.nms.get('iou_threshold'),
        score_threshold=_NOT_CANDIDATE / 2,
        pre_top_k=-1,
        keep_top_k=keep_top_k,
    )
