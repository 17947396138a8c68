//! Chats with images on a random-weight Gemma 3 vision folder (`scripts/make_tiny_model.py --vision`), through the batcher: prompt ids and greedy answers against mlx-vlm (`tests/vlm_reference.py`), batched with text, from the prefix cache, and the refusals.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use hangar_native_mlx::{
    BatchOptions, Batcher, ChatMessage, ChatOptions, Completion, Content, ContentPart, Error,
    GenerateRequest, Prompt, Session,
};
use serde_json::{json, Value};

use crate::batch::{try_run, try_run_together};
use crate::fixtures::{python, python_reference, repo};
use crate::greedy::{float32_tolerance, near_tie_at, near_ties, on_gpu};

/// Tokens each answer decodes (past end-of-sequence tokens).
const MAX_TOKENS: usize = 24;

/// The images, RGB PNGs of a colour gradient with noise: (file name,
/// width, height, colour at the start, at the end, down rather than
/// across). Shrunk, kept and shrunk unevenly to the tower's 64x64.
#[allow(clippy::type_complexity)]
const IMAGES: [(&str, u32, u32, [u8; 3], [u8; 3], bool); 3] = [
    ("shrunk.png", 50, 37, [230, 40, 20], [30, 200, 60], false),
    ("square.png", 64, 64, [10, 10, 40], [120, 180, 250], true),
    ("wide.png", 90, 40, [240, 220, 30], [90, 20, 140], true),
];

/// A message part: text, or the image of that file.
#[derive(Clone, Copy)]
enum Part {
    Text(&'static str),
    Image(&'static str),
}

/// Text before an image, long enough that the prompt's first block (128
/// tokens) is text alone and the image sits in its second.
const LONG: &str = "Local inference engines read a folder of weights, a tokenizer and a config. \
    They turn a prompt into tokens, run the network one step at a time, and turn the tokens \
    back into text. Tests check the number of tokens, the finish reason and the shape of every \
    answer, because random weights only produce noise. Once upon a time there was a little \
    hangar at the edge of a quiet airfield. Every morning the pilots opened its doors, checked \
    the engines, and wrote the numbers 0 1 2 3 4 5 6 7 8 9 into their logbooks before they flew \
    away.";
const QUESTION: &str = "Questions, answers, lists: one, two, three; red, green, blue. What does \
    the picture show, and how many engines does the hangar hold?";

/// The conversations: one user message each.
const CASES: [(&str, &[Part]); 5] = [
    (
        "one image",
        &[
            Part::Image("shrunk.png"),
            Part::Text("What is in this picture?"),
        ],
    ),
    (
        // The second image crosses the first prefill chunk's end (128).
        "two images",
        &[
            Part::Text("Compare this one"),
            Part::Image("shrunk.png"),
            Part::Text("with that one:"),
            Part::Image("square.png"),
            Part::Text("Which is brighter?"),
        ],
    ),
    (
        "text only",
        &[Part::Text("Hello there, how are you today?")],
    ),
    (
        "long, square image",
        &[
            Part::Text(LONG),
            Part::Image("square.png"),
            Part::Text(QUESTION),
        ],
    ),
    (
        "long, wide image",
        &[
            Part::Text(LONG),
            Part::Image("wide.png"),
            Part::Text(QUESTION),
        ],
    ),
];

/// Quantized copies, as mlx-vlm's converter writes them: (folder, bits,
/// whether the tower's linear layers are quantized too; its default keeps
/// the tower and projector dense).
const QUANTIZED: [(&str, u32, bool); 2] = [
    ("gemma3-vlm-q4", 4, false),
    ("gemma3-vlm-q8-tower", 8, true),
];

/// The cases asked of each quantized copy.
const QUANTIZED_CASES: [&str; 2] = ["one image", "two images"];

struct Fixture {
    _dir: tempfile::TempDir,
    model: PathBuf,
    images: PathBuf,
    /// mlx-vlm's prompt ids and greedy ids of each of [`CASES`].
    prompts: Vec<Vec<u32>>,
    answers: Vec<Vec<u32>>,
    /// The input embeddings its text model reads, for the cases of more
    /// than one image.
    embeddings: Vec<Option<Vec<f32>>>,
    /// mlx-vlm's greedy ids of [`QUANTIZED_CASES`] on each of [`QUANTIZED`].
    quantized: Vec<Vec<Vec<u32>>>,
}

/// The folder (three text layers, sliding windows of 32: the last tokens
/// of a prompt see an image's last rows in every layer; 64 soft tokens an
/// image, pooled 2x2 from 16x16 patches), the images and the reference,
/// made once.
fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("gemma3-vlm");
        let images = dir.path().join("images");
        std::fs::create_dir_all(&images).unwrap();
        let status = Command::new(python())
            .arg(repo().join("scripts/make_tiny_model.py"))
            .arg(&model)
            .args(["--arch", "gemma3", "--vision", "--layers", "3"])
            .args(crate::fixtures::WIDTH)
            .args(crate::fixtures::VISION_WIDTH)
            .args(["--window", "32"])
            .args([
                "--image-size",
                "64",
                "--patch-size",
                "4",
                "--mm-tokens",
                "64",
            ])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "make_tiny_model.py --vision failed");
        // Models without vision: a Llama, and a Gemma 3 folder whose
        // vision tower is a stub.
        for (name, arch) in [("llama", "llama"), ("gemma3-text", "gemma3")] {
            let status = Command::new(python())
                .arg(repo().join("scripts/make_tiny_model.py"))
                .arg(dir.path().join(name))
                .args(["--arch", arch])
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "make_tiny_model.py --arch {arch} failed");
        }
        let specs: Vec<Value> = IMAGES
            .iter()
            .enumerate()
            .map(|(i, (name, width, height, from, to, vertical))| {
                json!({"path": images.join(name), "width": width, "height": height,
                    "from": from, "to": to, "vertical": vertical, "seed": 100 + i})
            })
            .collect();
        let mut cases: Vec<Value> = CASES
            .iter()
            .map(|(_, parts)| {
                let content: Vec<Value> = parts
                    .iter()
                    .map(|part| match part {
                        Part::Text(text) => json!({"type": "text", "text": text}),
                        Part::Image(_) => json!({"type": "image"}),
                    })
                    .collect();
                let files: Vec<PathBuf> = parts
                    .iter()
                    .filter_map(|part| match part {
                        Part::Image(name) => Some(images.join(name)),
                        Part::Text(_) => None,
                    })
                    .collect();
                json!({"messages": [{"role": "user", "content": content}], "images": files,
                    "max_tokens": MAX_TOKENS, "embeddings": files.len() > 1})
            })
            .collect();
        let convert: Vec<Value> = QUANTIZED
            .iter()
            .map(|(name, bits, tower)| {
                json!({"mlx_path": dir.path().join(name), "bits": bits, "vision": tower})
            })
            .collect();
        for (name, ..) in QUANTIZED {
            for case in QUANTIZED_CASES {
                let mut on = cases[CASES.iter().position(|c| c.0 == case).unwrap()].clone();
                on["model"] = json!(dir.path().join(name));
                on["embeddings"] = json!(false);
                cases.push(on);
            }
        }
        let answer = python_reference(
            "vlm_reference.py",
            &json!({"model": model, "images": specs, "cases": cases, "convert": convert}),
        );
        let ids = |case: &Value, key: &str| -> Vec<u32> {
            serde_json::from_value(case[key].clone()).unwrap()
        };
        let (cases, quantized) = answer["cases"].as_array().unwrap().split_at(CASES.len());
        Fixture {
            quantized: quantized
                .chunks(QUANTIZED_CASES.len())
                .map(|per_model| per_model.iter().map(|c| ids(c, "ids")).collect())
                .collect(),
            prompts: cases.iter().map(|c| ids(c, "prompt")).collect(),
            answers: cases.iter().map(|c| ids(c, "ids")).collect(),
            embeddings: cases
                .iter()
                .map(|c| serde_json::from_value(c["embeddings"].clone()).ok())
                .collect(),
            _dir: dir,
            model,
            images,
        }
    })
}

/// The index of case `name` in [`CASES`].
fn case(name: &str) -> usize {
    CASES.iter().position(|(n, _)| *n == name).unwrap()
}

/// The conversation of case `name`, the images read from their files.
fn messages(name: &str) -> Vec<ChatMessage> {
    let (_, parts) = CASES[case(name)];
    let parts = parts
        .iter()
        .map(|part| match part {
            Part::Text(text) => ContentPart::text(*text),
            Part::Image(file) => {
                ContentPart::image(std::fs::read(fixture().images.join(file)).unwrap())
            }
        })
        .collect();
    vec![ChatMessage::with_parts("user", Content::Parts(parts))]
}

fn request(messages: Vec<ChatMessage>) -> GenerateRequest {
    let prompt = Prompt::Chat {
        messages,
        options: ChatOptions::default(),
    };
    let mut r = GenerateRequest::new(prompt, MAX_TOKENS);
    r.ignore_eos = true;
    r
}

fn session() -> Session {
    Session::load(&fixture().model).unwrap()
}

fn batcher(prefix_cache_bytes: usize) -> Batcher {
    Batcher::start(
        session(),
        BatchOptions {
            prefix_cache_bytes,
            ..BatchOptions::default()
        },
    )
}

/// Checks that `done`, case `name`'s answer, has mlx-vlm's greedy ids.
fn check(name: &str, done: &Completion, what: &str) {
    let want = &fixture().answers[case(name)];
    check_ids(&fixture().model, name, &done.token_ids, want, what)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Checks `got`, the greedy ids of the chat `name` on the folder `dir`,
/// against mlx-vlm's `want`: the same ids on the CPU; on a GPU, where they
/// part, each id of both a near tie of the session's greedy choice after
/// the same ids before it (see `tests/engine/greedy.rs`). The error says
/// where and by how much they part.
fn check_ids(dir: &Path, name: &str, got: &[u32], want: &[u32], what: &str) -> Result<(), String> {
    let what = format!("{name} ({what})");
    if !on_gpu() || got == want {
        if got == want {
            return Ok(());
        }
        let at = got.iter().zip(want).take_while(|(a, b)| a == b).count();
        return Err(format!(
            "{what}: first difference at token {at}\n  expected: {want:?}\n  got:      {got:?}"
        ));
    }
    let mut session = Session::load(dir).unwrap();
    let prompt = Prompt::Chat {
        messages: messages(name),
        options: ChatOptions::default(),
    };
    near_ties(got, want, near_tie_at(dir), &what, |ids| {
        let scores = session.score_prompt(&prompt, ids).unwrap();
        scores.iter().map(|s| (format!("{s:?}"), s.gap())).collect()
    })
}

#[test]
fn prompts_with_images_are_mlx_vlms() {
    // The template's <start_of_image> expanded into the image's soft
    // tokens, between blank lines, as Gemma3Processor writes it.
    let session = session();
    assert_eq!(session.reads_images(), Ok(()));
    for (i, (name, _)) in CASES.iter().enumerate() {
        let prompt = Prompt::Chat {
            messages: messages(name),
            options: ChatOptions::default(),
        };
        let ids = session.prompt_tokens(&prompt).unwrap();
        assert_eq!(ids, fixture().prompts[i], "{name}");
    }
}

#[test]
fn input_embeddings_with_images_are_mlx_vlms() {
    // The soft tokens in place, divided by sqrt(hidden) and scaled back
    // with the text by the bfloat16 scale: to float32 rounding (the tower
    // computes its patches as a product, mlx-vlm as a convolution; on a
    // GPU, TF32's).
    let mut session = session();
    let name = "two images";
    let want = fixture().embeddings[case(name)].as_ref().unwrap();
    let prompt = Prompt::Chat {
        messages: messages(name),
        options: ChatOptions::default(),
    };
    let got = session.prompt_embeddings(&prompt).unwrap();
    assert_eq!(got.len(), want.len());
    let diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    let largest = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    eprintln!("{name}: input embeddings differ by {diff:e} (largest {largest})");
    assert!(
        diff <= float32_tolerance(1e-4 * largest.max(1.0), largest),
        "differ by {diff}"
    );
}

#[test]
fn scoring_a_prompt_with_images_finds_mlx_vlms_greedy_ids() {
    // What the GPU's near-tie check scores by: the session's greedy choice
    // after each of mlx-vlm's ids, images in the prompt (exact on the CPU).
    let mut session = session();
    for name in ["one image", "two images"] {
        let want = &fixture().answers[case(name)];
        let prompt = Prompt::Chat {
            messages: messages(name),
            options: ChatOptions::default(),
        };
        let scores = session.score_prompt(&prompt, want).unwrap();
        assert_eq!(scores.len(), want.len());
        let worst = scores.iter().map(|s| s.gap()).fold(0.0, f32::max);
        let near = if on_gpu() {
            near_tie_at(&fixture().model)
        } else {
            0.0
        };
        assert!(worst <= near, "{name}: {scores:?}");
    }
}

#[test]
fn greedy_answers_with_images_are_mlx_vlms() {
    let b = batcher(0);
    for (name, _) in CASES {
        let done = try_run(&b, &request(messages(name))).unwrap();
        check(name, &done, "alone");
    }
}

#[test]
fn quantized_folders_with_images_answer_as_mlx_vlm() {
    // 4-bit text model with the dense tower mlx-vlm's converter keeps, and
    // 8-bit with the tower quantized as well.
    // Every folder and case before the failures are told.
    let root = fixture().model.parent().unwrap();
    let mut failures = Vec::new();
    for (m, (name, ..)) in QUANTIZED.iter().enumerate() {
        let b = Batcher::start(
            Session::load(&root.join(name)).unwrap(),
            BatchOptions::default(),
        );
        for (c, case) in QUANTIZED_CASES.iter().enumerate() {
            let done = try_run(&b, &request(messages(case))).unwrap();
            let want = &fixture().quantized[m][c];
            if let Err(e) = check_ids(&root.join(name), case, &done.token_ids, want, name) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn requests_with_images_batch_with_text_requests() {
    let b = batcher(0);
    let names = ["one image", "text only", "two images", "long, wide image"];
    let requests: Vec<GenerateRequest> = names.iter().map(|n| request(messages(n))).collect();
    let answers = try_run_together(&b, &requests);
    for (name, done) in names.iter().zip(answers) {
        check(name, &done.unwrap(), "batched");
    }
    assert!(b.peak_batch() >= 2, "peak batch {}", b.peak_batch());
}

#[test]
fn the_prefix_cache_holds_an_image_by_its_content() {
    let b = batcher(1 << 30);
    let first = try_run(&b, &request(messages("long, square image"))).unwrap();
    check("long, square image", &first, "cold");
    assert_eq!(first.usage.cached_prompt_tokens, 0);
    // The same text and image: both whole blocks (the image is in the
    // second) come from the cache.
    let again = try_run(&b, &request(messages("long, square image"))).unwrap();
    check("long, square image", &again, "cached");
    assert_eq!(again.usage.cached_prompt_tokens, 256);
    // The same text and another image: the text's block only.
    let other = try_run(&b, &request(messages("long, wide image"))).unwrap();
    check("long, wide image", &other, "after another image");
    assert_eq!(other.usage.cached_prompt_tokens, 128);
    // What the counts rest on: the image within the second block.
    let start = image_start("long, wide image");
    assert!((128..=192).contains(&start), "the image starts at {start}");
    // An image cut by a block's end: the second of "two images" continues
    // from its cached first rows.
    let cold = try_run(&b, &request(messages("two images"))).unwrap();
    check("two images", &cold, "cold");
    let cut = try_run(&b, &request(messages("two images"))).unwrap();
    check("two images", &cut, "with its first block cached");
    assert_eq!(cut.usage.cached_prompt_tokens, 128);
    let ids = &fixture().prompts[case("two images")];
    let soft = ids[image_start("two images")];
    assert!(
        ids[127] == soft && ids[128] == soft,
        "no image across position 128"
    );
}

/// Where the first soft token of case `name`'s prompt is: the first id
/// that repeats 64 times.
fn image_start(name: &str) -> usize {
    let ids = &fixture().prompts[case(name)];
    (0..ids.len())
        .find(|&i| ids[i..].len() >= 64 && ids[i..i + 64].iter().all(|&id| id == ids[i]))
        .unwrap()
}

#[test]
fn an_image_that_does_not_decode_is_a_clear_error() {
    let b = batcher(0);
    let png = std::fs::read(fixture().images.join("square.png")).unwrap();
    for (what, bytes) in [
        ("truncated PNG", png[..png.len() / 2].to_vec()),
        ("not an image", b"GIF89a? no, text".to_vec()),
    ] {
        let parts = vec![
            ContentPart::image(std::fs::read(fixture().images.join("shrunk.png")).unwrap()),
            ContentPart::text("and"),
            ContentPart::image(bytes),
        ];
        let r = request(vec![ChatMessage::with_parts("user", Content::Parts(parts))]);
        match try_run(&b, &r) {
            Err(e @ Error::Image(_)) => {
                let message = e.to_string();
                assert!(
                    message.contains("image 2 of the request")
                        && message.contains("PNG, JPEG, GIF, WebP or BMP"),
                    "{what}: {message}"
                );
            }
            other => panic!("{what}: not an image error: {other:?}"),
        }
    }
    // The engine serves on.
    let done = try_run(&b, &request(messages("one image"))).unwrap();
    check("one image", &done, "after the errors");
}

#[test]
fn images_where_they_cannot_be_read_are_refused_with_the_reason() {
    // A text model, and a Gemma 3 folder whose vision tower is a stub.
    for (model, reason) in [
        ("llama", "model type 'llama' has no vision in native-mlx"),
        ("gemma3-text", "has no vision tower"),
    ] {
        let dir = fixture().model.parent().unwrap().join(model);
        let b = Batcher::start(Session::load(&dir).unwrap(), BatchOptions::default());
        let r = request(messages("one image"));
        let message = match try_run(&b, &r) {
            Err(e @ Error::InvalidRequest(_)) => e.to_string(),
            other => panic!("{model}: {other:?}"),
        };
        assert!(
            message.contains("lacks the vision capability") && message.contains(reason),
            "{model}: {message}"
        );
    }
    // As many <start_of_image> as images, or the request is refused.
    let b = batcher(0);
    let mut typed = messages("one image");
    if let Content::Parts(parts) = &mut typed[0].content {
        parts.push(ContentPart::text("and <start_of_image> typed"));
    }
    let message = try_run(&b, &request(typed)).unwrap_err().to_string();
    assert!(
        message.contains("has 1 image(s) but the rendered chat template has 2"),
        "{message}"
    );
}
