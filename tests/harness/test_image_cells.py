"""Image cells: the grid's cells with pictures, their dataset (the multimodal checkpoint's reading task), the
client arguments that send them through the chat endpoint, workload parity against the pictures' answers,
their own headline and guard, and held parity prompts with pictures."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.bench import BenchJob, BenchResult, CellRun, _write_datasets, job_argv
from harness.config import BenchmarkConfig, Cell, ImageCells, ParityConfig, StatsConfig
from harness.datasets import LEVELS, read_task_requests
from harness.errors import ParityError
from harness.measure import Build, GridResult, split_headlines
from harness.parity import _parse_chat_choice, _request, load_prompts
from harness.stats import SpeedupCI, decide
from harness.workload import compare_workload

ROOT = Path(__file__).resolve().parents[2]
MM_MODEL = ROOT / "experiments" / "models" / "gemma4-tiny-mm"
IMAGE_CELL = Cell(input_len=16, output_len=4, images=1, image_size=96)


def _bench(**images: object) -> BenchmarkConfig:
    return BenchmarkConfig(input_lens=[128], output_lens=[4], dataset="copy-task",
                           images=ImageCells(input_lens=[16, 128], output_lens=[4], **images))


def test_image_cells_join_the_grid_after_the_text_cells_with_their_own_labels() -> None:
    labels = [c.label for c in _bench().cells()]
    assert labels == ["in128/out4", "in128/out1", "in16/out4/img1x96", "in128/out4/img1x96",
                      "in16/out1/img1x96", "in128/out1/img1x96"]
    assert [c.label for c in BenchmarkConfig(input_lens=[128], output_lens=[4]).cells()] == ["in128/out4", "in128/out1"]


def test_a_reading_task_grid_it_cannot_answer_is_refused_at_load() -> None:
    with pytest.raises(ValidationError, match="one picture per request"):
        ImageCells(input_lens=[16], output_lens=[4], per_request=2)
    with pytest.raises(ValidationError, match="multiple of 8"):
        ImageCells(input_lens=[16], output_lens=[4], size=100)
    with pytest.raises(ValidationError, match="at least 2"):
        ImageCells(input_lens=[1], output_lens=[4])
    ImageCells(input_lens=[1], output_lens=[4], per_request=3, size=100, dataset="random-mm")   # speed only: fine
    with pytest.raises(ValidationError, match="could judge neither"):
        _bench(dataset="random-mm")       # copy-task text beside random pictures: workload parity would go blind
    BenchmarkConfig(input_lens=[128], output_lens=[4], images=ImageCells(input_lens=[16], output_lens=[4],
                                                                         dataset="random-mm"))


def _cells_of(png: bytes) -> list[int]:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    step = img.width // 8
    out = []
    for k in range(64):
        r, g, b = img.getpixel(((k % 8) * step + step // 2, (k // 8) * step + step // 2))
        out.append(LEVELS.index(r) * 16 + LEVELS.index(g) * 4 + LEVELS.index(b))
    return out


def test_reading_requests_have_the_cells_text_length_and_their_pictures_answer() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MM_MODEL / "tokenizer.json"))
    reqs = read_task_requests(Cell(input_len=128, output_len=70, images=1, image_size=192), 6, seed=0, repeat=0)
    for req in reqs:
        ids = tok.encode(req.text).ids                       # the tokenizer adds <bos>, as the chat template does
        assert len(ids) == 128 and ids[-1] == tok.token_to_id("<read>")
        cells = _cells_of(req.image)
        assert tuple(cells) == req.cells
        assert req.answer(70) == [f"t{5 + cells[k % 64]}" for k in range(70)]    # read off the picture, repeated
    assert len({r.cells for r in reqs}) == 6
    short = read_task_requests(Cell(input_len=2, output_len=4, images=1, image_size=96), 1, seed=0, repeat=0)
    assert short[0].text == "<read>"
    other = read_task_requests(Cell(input_len=128, output_len=70, images=1, image_size=192), 6, seed=0, repeat=1)
    assert not {r.cells for r in reqs} & {r.cells for r in other}        # fresh pictures per repeat


def test_an_image_job_goes_through_the_chat_endpoint_with_the_harness_written_pictures(tmp_path: Path) -> None:
    bench = _bench()
    job = BenchJob(cell=IMAGE_CELL, base_url="http://x", model_name="m", tokenizer=MM_MODEL, tag="A", repeat=0)
    argv = job_argv(job, bench, tmp_path, "r.json")
    assert argv[argv.index("--backend") + 1] == "openai-chat"
    assert argv[argv.index("--endpoint") + 1] == "/v1/chat/completions"
    assert argv[argv.index("--dataset-name") + 1] == "custom_image" and "--skip-chat-template" not in argv
    assert "--custom-ensure-client-side-data" in argv          # pictures inline: the server reads no files
    written = _write_datasets([job], bench, tmp_path)
    path = Path(argv[argv.index("--dataset-path") + 1])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    prompts, answers = written[path]
    assert [x["prompt"] for x in lines] == list(prompts) and len(answers) == bench.num_prompts
    first = Path(lines[0]["image_files"][0])
    assert first.is_file() and _cells_of(first.read_bytes())[:4] == [int(a[1:]) - 5 for a in answers[0]]
    text_job = BenchJob(cell=Cell(input_len=128, output_len=4), base_url="http://x", model_name="m",
                        tokenizer=MM_MODEL, tag="A", repeat=0)
    assert job_argv(text_job, bench, tmp_path, "t.json")[:2] == ["--base-url", "http://x"]
    assert "--backend" in (text := job_argv(text_job, bench, tmp_path, "t.json")) and \
        text[text.index("--backend") + 1] == "vllm"
    random_mm = job_argv(job, BenchmarkConfig(input_lens=[128], output_lens=[4], images=ImageCells(
        input_lens=[16], output_lens=[4], dataset="random-mm")), tmp_path, "m.json")
    assert random_mm[random_mm.index("--dataset-name") + 1] == "random-mm"
    assert random_mm[random_mm.index("--random-mm-bucket-config") + 1] == "{(96, 96, 1): 1.0}"


def _result(texts: list[str], input_tokens: int) -> BenchResult:
    base = {k: 1.0 for k in BenchResult.model_fields}
    base.update(duration=2.0, completed=len(texts), failed=0, total_input_tokens=input_tokens * len(texts),
                total_output_tokens=4 * len(texts), generated_texts=texts)
    return BenchResult.model_validate(base)


def _image_run(tag: str, texts: list[str], answers: list[list[str]]) -> CellRun:
    job = BenchJob(cell=IMAGE_CELL, base_url="", model_name="m", tokenizer=MM_MODEL, tag=tag, repeat=0)
    return CellRun(job=job, result=_result(texts, 16 + 66), wall_s=2.5, prompts=tuple(["<read>"] * len(texts)),
                   answers=tuple(tuple(a) for a in answers))


def test_image_requests_count_their_image_tokens_and_are_scored_against_the_pictures() -> None:
    answers = [[f"t{5 + i}"] * 4 for i in range(12)]
    right = [" ".join(a) for a in answers]
    ref = _image_run("A", right, answers)
    assert ref.metrics()["image_tokens_per_request"] == 66 and ref.metrics()["prefill_tok_s"] == 12 * 82 / 2.0
    misread = right[:2] + ["t99 t99 t99 t99"] * 10            # the candidate misreads 10 of 12 pictures
    report = compare_workload([ref], [_image_run("B", misread, answers)], tokenizer=MM_MODEL,
                              reference_url="http://127.0.0.1:9", alpha=0.01)
    assert report.scores is not None and report.scores.candidate_only == 10 and not report.ok
    assert all(d.reference_margin is None for d in report.divergences)   # no margin asked without the picture
    same = compare_workload([ref], [_image_run("B", right, answers)], tokenizer=MM_MODEL, alpha=0.01)
    assert same.ok and same.identical == 12


def _grid(tag: str, values: dict[Cell, list[float]]) -> GridResult:
    grid = GridResult(build=Build(tag=tag, tree=Path("."), engine_args={}), startup_s=1.0, evidence={})
    for cell, xs in values.items():
        for rep, x in enumerate(xs):
            job = BenchJob(cell=cell, base_url="", model_name="m", tokenizer=MM_MODEL, tag=tag, repeat=rep)
            result = _result(["t5"], 1).model_copy(update={"total_token_throughput": x})
            grid.runs.append(CellRun(job=job, result=result, wall_s=2.0))
    return grid


def test_text_and_image_cells_have_their_own_headlines_and_an_image_slowdown_is_rejected() -> None:
    text, image = Cell(input_len=128, output_len=4), IMAGE_CELL
    a = _grid("A", {text: [100, 101, 99, 100], image: [50, 51, 49, 50]})
    b = _grid("B", {text: [130, 132, 129, 131], image: [40, 41, 39, 40]})   # text 1.3x, pictures 0.8x
    stats = StatsConfig()
    overall, images = split_headlines(a, b, [text, image], stats)
    assert overall.ratio == pytest.approx(1.3, rel=0.01)
    assert images is not None and images.ratio == pytest.approx(0.8, rel=0.01)
    cells = {"in128/out4": overall}                               # the text cell alone clears the threshold
    assert decide(overall, cells, stats).accept
    verdict = decide(overall, cells, stats, images=images)
    assert not verdict.accept and "image cells" in verdict.reason
    only_text, none = split_headlines(a, b, [text], stats)
    assert none is None and only_text.ratio == pytest.approx(1.3, rel=0.01)
    implausible = SpeedupCI(20.0, 19.0, 21.0, 4)
    assert decide(overall, cells, stats, images=implausible).quarantine


def test_held_prompts_with_pictures_go_to_the_chat_endpoint_and_are_parsed(tmp_path: Path) -> None:
    png = base64.b64encode(b"\x89PNG...").decode()
    path = tmp_path / "held.jsonl"
    picture = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    path.write_text(json.dumps({"id": "p1", "prompt_token_ids": [2, 263, 256], "expected_token_ids": [5, 6],
                                "content": [{"type": "text", "text": "<read>"}, picture]})
                    + "\n" + json.dumps({"id": "p2", "prompt_token_ids": [2, 3, 7]}) + "\n")
    p1, p2 = load_prompts(path)
    assert p1.has_images and not p2.has_images
    config = ParityConfig(prompts=path, max_tokens=2, top_logprobs=2)
    endpoint, body = _request("m", p1, config)
    assert endpoint == "/v1/chat/completions" and body["messages"][0]["content"][1]["type"] == "image_url"
    assert body["logprobs"] is True and body["top_logprobs"] == 2 and body["return_token_ids"] is True
    assert _request("m", p2, config)[0] == "/v1/completions"
    chat = {"choices": [{"token_ids": [9, 10], "logprobs": {"content": [
        {"token": "token_id:9", "logprob": -0.1, "top_logprobs": [{"token": "token_id:11", "logprob": -5.0},
                                                                   {"token": "token_id:9", "logprob": -0.1}]},
        {"token": "token_id:10", "logprob": -0.2, "top_logprobs": [{"token": "token_id:10", "logprob": -0.2},
                                                                    {"token": "token_id:12", "logprob": -7.0}]}]}}]}
    gen = _parse_chat_choice(p1, chat)
    assert gen.token_ids == (9, 10) and gen.top_logprobs[0] == ((9, -0.1), (11, -5.0))
    assert gen.margin(1) == pytest.approx(6.8)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "http://169.254.169.254/x.png", "/tmp/x.png"])
def test_a_held_prompt_cannot_point_the_server_at_a_file_or_the_network(tmp_path: Path, url: str) -> None:
    path = tmp_path / "held.jsonl"
    path.write_text(json.dumps({"id": "p", "prompt_token_ids": [2], "content": [
        {"type": "image_url", "image_url": {"url": url}}]}) + "\n")
    with pytest.raises(ParityError, match="data:image"):
        load_prompts(path)


def test_image_cells_need_held_prompts_with_pictures() -> None:
    bench = _bench()
    parity = ParityConfig(prompts=Path("x.jsonl"))
    gaps = parity.coverage_gaps(bench.model_copy(update={"max_concurrency": 2}), [200, 200], with_images=0)
    assert any("carry a picture" in g for g in gaps)
    assert not [g for g in parity.coverage_gaps(bench.model_copy(update={"max_concurrency": 2}), [200, 200],
                                                with_images=2) if "picture" in g]
    said_why = ParityConfig(prompts=Path("x.jsonl"), images_uncovered="a text-only parity checkpoint")
    assert not [g for g in said_why.coverage_gaps(bench.model_copy(update={"max_concurrency": 2}), [200, 200])
                if "picture" in g]


def test_the_embedded_multimodal_spec_is_runnable_and_its_policy_adds_only_the_multimodal_inputs() -> None:
    from agent.campaign import check_runnable
    from agent.spec import load_spec
    from policies.model import load_policy

    spec = load_spec(ROOT / "experiments" / "gemma4-tiny-mm-cpu.yaml")
    check_runnable(spec)      # held prompts cover the text lengths and carry pictures; the checkpoint has weights
    assert spec.benchmark.images is not None and spec.benchmark.images.dataset == "read-task"
    default = load_policy(ROOT / "policies" / "default.yaml")
    multimodal = load_policy(spec.policy)
    added = {r.id for r in multimodal.paths} - {r.id for r in default.paths}
    assert added == {"allow-multimodal-inputs"}
