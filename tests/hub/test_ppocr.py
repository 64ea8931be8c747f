"""OCR in the hub: the NumPy geometry against OpenCV's numbers, the pipeline's sizes and stages
with stand-in programs, a tiny OCR module end to end (served too, and fed bad requests), and
the built-in ppocr_v4 module against RapidOCR's own results on real images."""
import base64
import io

import numpy as np
import pytest
import tiny_modules

import paddlejax as pj
from paddlejax.hub import ocr, processor
from paddlejax.hub.errors import HubError, ModuleFormatError, RequestError

# RapidOCR 1.4.4's own pipeline (OpenCV 4.14 geometry, onnxruntime 1.32, default settings) on
# the two images below: (box, text, score) per line.
RENDERED_REFERENCE = [([[9, 24], [368, 25], [368, 74], [9, 73]], "Hello paddlejax 2026", 0.9996)]
SKIMAGE_TEXT_REFERENCE = [([[3, 23], [121, 58], [104, 114], [0, 79]], "S=", 0.5868),
                          ([[392, 82], [410, 82], [410, 95], [392, 95]], "2", 0.628)]


def rendered_line() -> np.ndarray:
    """'Hello paddlejax 2026' in Pillow's scalable font, black on white, 448x96 grey."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (448, 96), 255)
    ImageDraw.Draw(image).text((16, 24), "Hello paddlejax 2026", fill=0, font=ImageFont.load_default(size=36))
    return np.asarray(image)


def png_base64(pixels: np.ndarray) -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def polygon_mask(box, shape) -> np.ndarray:
    from skimage.draw import polygon

    mask = np.zeros(shape, bool)
    rows, cols = polygon([p[1] for p in box], [p[0] for p in box], shape)
    mask[rows, cols] = True
    return mask


def iou(a, b, shape) -> float:
    a, b = polygon_mask(a, shape), polygon_mask(b, shape)
    return (a & b).sum() / (a | b).sum()


# -- the geometry, against OpenCV -----------------------------------------------------------------
def test_resize_and_perspective_crop_round_as_opencv():
    # cv2.resize(ramp, (4, 7)) and cv2.warpPerspective(..., INTER_CUBIC, BORDER_REPLICATE) gave these
    ramp = np.arange(15, dtype=np.uint8).reshape(3, 5) * 17
    assert ocr.resize_linear(ramp, (7, 4)).tolist() == [
        [2, 23, 44, 66], [14, 36, 57, 78], [51, 72, 93, 114], [87, 108, 130, 151], [124, 145, 166, 187],
        [160, 181, 202, 224], [172, 193, 215, 236]]
    assert ocr.resize_linear(ramp, (2, 2)).tolist() == [[34, 76], [161, 204]]
    image = (np.arange(64).reshape(8, 8) * 4).astype(np.uint8)
    quad = np.array([[1.5, 1], [6, 2], [5.5, 6.5], [1, 5]], np.float32)
    assert ocr.warp_quad(image, quad, (4, 5)).tolist() == [
        [38, 49, 58, 66, 75], [70, 80, 90, 99, 110], [101, 113, 122, 132, 145], [133, 145, 155, 166, 181]]
    colour = np.stack([image, 255 - image, image // 2], axis=-1)
    crop = ocr.warp_quad(colour, quad, (4, 5))
    assert crop.shape == (4, 5, 3) and (crop[..., 0] == ocr.warp_quad(image, quad, (4, 5))).all()


def test_db_boxes_and_scores_are_paddleocrs():
    prob = np.zeros((64, 96), np.float32)
    prob[ocr._fill_mask(prob.shape, np.array([[10, 20], [70, 10], [72, 22], [12, 32]]))] = 0.9  # a tilted line
    prob[50:52, 80:82] = 0.95  # too small for a line
    prob[45:58, 5:40] = 0.4  # text pixels, but too faint on average
    prob[40:50, 60:90] = 0.8
    boxes, scores = ocr.db_text_boxes(prob, (128, 192), ocr.DB_DEFAULTS)
    # RapidOCR's DBPostProcess (OpenCV contours and boxes, pyclipper's unclip) gave these
    assert sorted((b.tolist(), round(s, 4)) for b, s in zip(boxes, scores)) == [
        ([[0, 23], [157, 0], [167, 61], [7, 87]], 0.7582), ([[106, 66], [192, 66], [192, 118], [106, 118]], 0.605)]
    assert all(b.dtype == np.int32 for b in boxes)
    fewer, _ = ocr.db_text_boxes(prob, (128, 192), {**ocr.DB_DEFAULTS, "box_threshold": 0.7})
    assert len(fewer) == 1
    ring = np.zeros((40, 40), np.float32)
    ring[5:35, 5:35] = 0.9
    ring[12:28, 12:28] = 0.0  # a region with a hole: its inner border is a contour too
    assert len(ocr.db_text_boxes(ring, (40, 40), {**ocr.DB_DEFAULTS, "box_threshold": 0.0})[0]) == 2


def test_ctc_decoding_merges_repeats_and_drops_blanks():
    classes = ["", "a", "b", " "]
    steps = [1, 1, 0, 1, 3, 2, 2, 0]  # a a _ a ' ' b b _  ->  "aa b"
    probs = np.full((1, len(steps), 4), 0.1)
    probs[0, np.arange(len(steps)), steps] = [0.9, 0.7, 0.99, 0.8, 0.6, 0.5, 0.9, 0.99]
    [(text, score)] = ocr.ctc_decode(probs, classes)
    assert text == "aa b" and score == pytest.approx(np.mean([0.9, 0.8, 0.6, 0.5]))
    assert ocr.ctc_decode(np.stack([probs[0], probs[0, ::-1]]), classes, blank=0)[1][0] == "b aa"


# -- the pipeline, with stand-in programs ----------------------------------------------------------
SPEC = {"det": {"limit_side_len": 64, "limit_type": "min", **ocr.DB_DEFAULTS},
        "cls": {"labels": ["0", "180"], "threshold": 0.9, "batch_size": 2},
        "rec": {"score_threshold": 0.5, "batch_size": 2}}


def normalize(pixels):
    return ((pixels.astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1)


def dark_map(batch):
    """A stand-in detector: dark pixels are text."""
    return (batch.mean(axis=1, keepdims=True) < -0.5).astype(np.float32) * 0.9


def test_images_are_padded_to_the_smallest_compiled_size_or_shrunk_to_fit():
    seen = []

    def det(batch):
        seen.append(batch)
        return dark_map(batch)

    pipeline = ocr.OCRPipeline(SPEC, normalize, det={(64, 128): det, (64, 256): det, (128, 128): det})
    image = np.full((48, 80, 3), 255, np.uint8)
    image[16:32, 10:70] = 0
    [result] = pipeline(image)  # short side 48 -> 64: 64x106 -> 64x96, padded into 64x128
    assert seen[-1].shape == (1, 3, 64, 128) and (seen[-1][:, :, :, 96:] == 0).all()
    assert set(result) == {"box", "score"} and result["score"] > 0.5
    box = np.array(result["box"])
    assert box[:, 0].min() <= 10 and box[:, 0].max() >= 69 and box[:, 1].min() <= 16 and box[:, 1].max() >= 31
    assert box[:, 0].max() <= 80 and box[:, 1].max() <= 48
    wide = np.full((50, 400, 3), 255, np.uint8)
    wide[15:35, 20:380] = 0
    [result] = pipeline(wide)  # 64x512 fits none: shrunk into the roomiest, 64x256, as 32x256
    assert seen[-1].shape == (1, 3, 64, 256) and (seen[-1][:, :, 32:] == 0).all()
    box = np.array(result["box"])
    assert box[:, 0].min() <= 20 and box[:, 0].max() >= 379


def test_upside_down_lines_are_turned_and_batches_padded_to_a_compiled_width():
    recognised = []

    def cls(batch):  # "180" when the line's dark end is on the right
        right_darker = batch[:, :, :, 8:16].mean(axis=(1, 2, 3)) < batch[:, :, :, :8].mean(axis=(1, 2, 3))
        return np.stack([np.where(right_darker, 0.05, 0.95), np.where(right_darker, 0.95, 0.05)], axis=1)

    def rec(batch):
        recognised.append(batch)
        left_darker = batch[:, :, :, :4].mean(axis=(1, 2, 3)) < batch[:, :, :, 4:8].mean(axis=(1, 2, 3))
        probs = np.zeros((len(batch), 2, 3))
        probs[:, 0, 1] = np.where(left_darker, 0.9, 0.0)
        probs[:, 0, 2] = np.where(left_darker, 0.0, 0.9)
        probs[:, 0, 0] = 0.1
        probs[:, 1, 0] = 1.0
        return probs

    pipeline = ocr.OCRPipeline(SPEC, normalize, cls=((8, 16), cls), rec={16: rec, 48: rec}, rec_height=8,
                               characters=["", "L", "R"])
    line = np.full((8, 16, 3), 255, np.uint8)
    line[:, :6] = 0  # dark on the left
    assert pipeline(line) == [{"box": [[0.0, 0.0], [16.0, 0.0], [16.0, 8.0], [0.0, 8.0]], "text": "L", "score": 0.9}]
    assert recognised[-1].shape == (1, 3, 8, 16)
    assert pipeline(np.ascontiguousarray(line[::-1, ::-1]))[0]["text"] == "L"  # turned before reading
    long_line = np.full((8, 40, 3), 255, np.uint8)
    long_line[:, :4] = 0
    assert pipeline(long_line)[0]["text"] == "L" and recognised[-1].shape == (1, 3, 8, 48)


def test_lines_scoring_under_the_threshold_are_dropped():
    def rec(batch):
        return np.tile([[[0.4, 0.6]]], (len(batch), 1, 1))

    spec = {**SPEC, "rec": {"score_threshold": 0.7}}
    line = np.full((8, 16, 3), 255, np.uint8)
    assert ocr.OCRPipeline(spec, normalize, rec={16: rec}, rec_height=8, characters=["", "x"])(line) == []
    spec["rec"]["score_threshold"] = 0.5
    assert ocr.OCRPipeline(spec, normalize, rec={16: rec}, rec_height=8, characters=["", "x"])(line)[0]["text"] == "x"


# -- the processor spec ----------------------------------------------------------------------------
GOOD = {"kind": "ocr", "det": {"kind": "db_text_boxes", "programs": ["det"]},
        "rec": {"kind": "ctc_decode", "programs": ["rec"], "dictionary": "chars.txt"}}


@pytest.mark.parametrize("change, message", [
    ({"det": None, "rec": None}, "needs a det stage, a rec stage or both"),
    ({"rec": None, "cls": {"program": "cls"}}, "a cls stage turns lines for the recogniser"),
    ({"det": {"kind": "ctc_decode", "programs": ["det"]}}, "postprocess.det.kind: must be 'db_text_boxes'"),
    ({"det": {"programs": ["det"], "thresh": 0.3}}, r"unknown keys \['thresh'\]"),
    ({"det": {"programs": []}}, "postprocess.det.programs: must be a non-empty list of names"),
    ({"det": {"programs": ["det"], "box_threshold": 1.5}}, r"box_threshold: must be a number in 0..1"),
    ({"det": {"programs": ["det"], "limit_type": "long"}}, "limit_type: must be 'min' or 'max'"),
    ({"det": {"programs": ["det"], "limit_side_len": 7.5}}, "limit_side_len: must be an int"),
    ({"rec": {"programs": ["rec"]}}, "postprocess.rec.dictionary: must name the dictionary file"),
    ({"rec": {"programs": ["rec"], "dictionary": "d", "batch_size": 0}}, "batch_size: must be an int in 1.."),
    ({"resize": {"max_side": 10}}, r"postprocess.resize: unknown keys \['max_side'\]"),
])
def test_bad_ocr_specs_are_refused_by_name(change, message):
    spec = {**GOOD, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    with pytest.raises(ModuleFormatError, match=message):
        processor.check_postprocess(spec)


def test_the_dictionary_gives_the_classes_with_blank_and_space(tmp_path):
    (tmp_path / "d.txt").write_text("a\nb\n\u00e9\n", encoding="utf-8")
    assert processor.ocr_classes({"dictionary": "d.txt"}, tmp_path) == ["", "a", "b", "\u00e9", " "]
    assert processor.ocr_classes({"dictionary": "d.txt", "use_space_char": False, "blank": 3}, tmp_path) == \
        ["a", "b", "\u00e9", ""]
    with pytest.raises(ModuleFormatError, match="must name a file inside the module"):
        processor.ocr_classes({"dictionary": "../d.txt"}, tmp_path)


# -- a tiny OCR module: the hub's plumbing ---------------------------------------------------------
def blocks() -> np.ndarray:
    image = np.full((64, 128), 255, np.uint8)
    image[16:48, 16:56] = 0
    image[16:48, 88:112] = 0
    return image


@pytest.fixture
def tiny_ocr(tmp_path):
    tiny_modules.write_ocr_module(tmp_path / "tiny_ocr")
    return pj.hub.Module(directory=tmp_path / "tiny_ocr")


def test_a_tiny_ocr_module_finds_and_reads_each_block_in_reading_order(tiny_ocr):
    [lines] = tiny_ocr.recognize_text(blocks())
    assert [line["text"] for line in lines] == ["a", "a"]
    for line, (x0, x1) in zip(lines, [(16, 56), (88, 112)]):
        box = np.array(line["box"])
        assert box.shape == (4, 2) and box[:, 0].min() <= x0 and box[:, 0].max() >= x1 - 1
        assert box[:, 1].min() <= 16 and box[:, 1].max() >= 47 and 0.5 <= line["score"] <= 1
    assert tiny_ocr.recognize_text([blocks()[:, ::-1], np.full((40, 40), 255, np.uint8)])[1] == []
    assert set(tiny_ocr.predictors) == {"det", "rec"}
    assert tiny_ocr.run_batch([blocks()]) == [lines]


def test_ocr_modules_refuse_other_methods_and_say_which_to_use(tiny_ocr):
    with pytest.raises(HubError, match="use recognize_text"):
        tiny_ocr.predict([blocks()])
    with pytest.raises(HubError, match="one predictor per program; prepare"):
        tiny_ocr.predictor  # noqa: B018
    assert set(tiny_ocr.prepare().predictors) == {"det", "rec"}


@pytest.mark.parametrize("image, message", [
    (np.zeros((0, 10), np.uint8), r"an image array is empty \(\[0, 10\]\)"),
    (np.zeros((8, 8, 2), np.uint8), r"must be \[H, W\], \[H, W, 1\], \[H, W, 3\] or \[H, W, 4\], got \[8, 8, 2\]"),
    (np.zeros((2, 8, 8, 3, 1), np.uint8), "must be"),
    (np.zeros((8, 8), np.complex64), "must hold numbers"),
    (np.array([["a"]]), "must hold numbers"),
    (b"not an image", "could not be decoded"),
    (3.5, "an image must be encoded bytes, base64 text, a file path or an array, got float"),
])
def test_malformed_images_get_clear_errors(tiny_ocr, image, message):
    with pytest.raises(RequestError, match=message):
        tiny_ocr.recognize_text([image])


def test_a_module_whose_dictionary_does_not_match_its_recogniser_is_refused(tmp_path):
    tiny_modules.write_ocr_module(tmp_path / "m", characters=["a", "b", "c"])
    module = pj.hub.Module(directory=tmp_path / "m")  # programs are read when first needed
    with pytest.raises(ModuleFormatError, match="make 5 classes but program 'rec' gives 4"):
        module.check_programs()
    tiny_modules.write_ocr_module(tmp_path / "n", det={"programs": ["detector"]})
    with pytest.raises(ModuleFormatError, match=r"names programs \['detector'\] that the module lacks"):
        pj.hub.Module(directory=tmp_path / "n")
    det, rec = tiny_modules.ocr_programs()
    tiny_modules.write_ocr_module(tmp_path / "swapped", programs=(rec, det))
    with pytest.raises(ModuleFormatError, match=r"detector program 'det' must give a text probability map "
                                                 r"\[b, 1, 8, 32\], gives f32\[b,4,4\]"):
        pj.hub.Module(directory=tmp_path / "swapped").check_programs()


def test_predict_serves_ocr_results_and_answers_bad_requests_in_paddlehubs_shape(tiny_ocr):
    from starlette.testclient import TestClient

    from paddlejax.hub.serving import create_app

    with TestClient(create_app({"tiny_ocr": tiny_ocr}, max_wait_ms=1)) as client:
        answer = client.post("/predict/tiny_ocr", json={"images": [png_base64(blocks())] * 2})
        assert answer.status_code == 200 and answer.json()["status"] == "000"
        assert answer.json()["results"] == tiny_ocr.recognize_text([blocks()] * 2)
        for body, message in [({"images": [""]}, "image 0: an image could not be decoded"),
                              ({"images": [base64.b64encode(b"GIF89a").decode()]}, "could not be decoded"),
                              ({"images": []}, '"images" is empty'),
                              ({"texts": ["x"]}, 'expects a JSON object with "images"'),
                              ({"images": ["not base64!"]}, "not base64")]:
            bad = client.post("/predict/tiny_ocr", json=body)
            assert bad.status_code == 400 and bad.json()["status"] == "101" and message in bad.json()["msg"], bad.json()
        assert client.get("/modules/tiny_ocr").json()["task"] == "ocr"


# -- the built-in module ---------------------------------------------------------------------------
@pytest.mark.slow
def test_ppocr_v4_reads_what_rapidocr_reads_in_process_and_over_http(tmp_path):
    from skimage import data
    from starlette.testclient import TestClient

    from paddlejax.hub import builtin
    from paddlejax.hub.serving import create_app

    # the detector sizes these images use (the full module adds five more for other page shapes)
    builtin.build("ppocr_v4", tmp_path / "ppocr_v4", progress=False, det_sizes=((736, 1920), (736, 2944)))
    ppocr = pj.hub.Module(directory=tmp_path / "ppocr_v4")
    line, text = rendered_line(), data.text()
    results = ppocr.recognize_text([line, text, np.ascontiguousarray(line[::-1, ::-1])])
    for got, want, image in zip(results, [RENDERED_REFERENCE, SKIMAGE_TEXT_REFERENCE], [line, text]):
        assert [r["text"] for r in got] == [w[1] for w in want]
        for r, (box, _, score) in zip(got, want):
            assert iou(r["box"], box, image.shape) > 0.85 and r["score"] == pytest.approx(score, abs=0.01)
    ink = line < 128
    assert (ink & polygon_mask(results[0][0]["box"], line.shape)).sum() / ink.sum() > 0.99
    # upside down: the direction classifier turns the line before it is read
    assert [r["text"] for r in results[2]] == ["Hello paddlejax 2026"]
    assert np.array(results[2][0]["box"])[:, 0].min() > 60  # the text now sits at the right
    with TestClient(create_app({"ppocr_v4": ppocr}, max_wait_ms=1)) as client:
        answer = client.post("/predict/ppocr_v4", json={"images": [png_base64(line)]}).json()
    assert answer == {"status": "000", "msg": "", "results": results[:1]}
