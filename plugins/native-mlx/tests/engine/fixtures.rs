//! Random-weight model folders and mlx-lm's reference outputs, made once per test run.
//!
//! Needs the venv of `scripts/python-env.sh` (mlx 0.32.4, mlx-lm); set
//! `HANGAR_PYTHON` to use another interpreter.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{json, Value};

/// Prompt ids shared by the parity cases (the tiny vocabulary has 512 ids).
pub const PROMPT: [u32; 12] = [1, 17, 42, 99, 7, 256, 300, 12, 5, 480, 63, 200];
/// Tokens generated per parity case.
pub const MAX_TOKENS: usize = 64;

/// A greedy or seeded case compared with mlx-lm.
pub struct Case {
    pub model: &'static str,
    pub temp: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub seed: u64,
}

const fn greedy(model: &'static str) -> Case {
    Case {
        model,
        temp: 0.0,
        top_p: 0.0,
        top_k: 0,
        min_p: 0.0,
        seed: 0,
    }
}

/// Every model the parity test covers: each family in float32 and 4-bit,
/// 8-bit, bfloat16 and float16, tied embeddings (dense and quantized) and
/// Llama 3 RoPE scaling; Phi-3 with LongRoPE and partial rotary embeddings
/// (transformers refuses any other Phi-3 scaling); Gemma 3 (sliding windows of 8 positions, shorter
/// than the prompt) as `gemma3_text` in four types and as the text model of
/// a `gemma3` folder; Qwen3-MoE (Hugging Face's per-expert layout in
/// float32, mlx-lm's stacked experts in 4- and 8-bit; MLX's CPU `gather_mm`
/// multiplies float32 only); gpt-oss (sliding windows of 8 positions, shorter
/// than the prompt; sinks, YaRN, biases) in float32, 4-bit and MXFP4; MiMo
/// (Qwen2 with an MTP layer, which neither mlx-lm's `mimo` nor the
/// network reads) in float32 and 4-bit (mlx-lm's converter drops the MTP
/// layer); then two seeded sampling cases.
pub const CASES: &[Case] = &[
    greedy("llama"),
    greedy("llama-q4"),
    greedy("llama-q8"),
    greedy("qwen2"),
    greedy("qwen2-q4"),
    greedy("qwen3"),
    greedy("qwen3-q4"),
    greedy("mistral"),
    greedy("llama-bf16"),
    greedy("qwen3-f16"),
    greedy("llama-tied"),
    greedy("llama-tied-q4"),
    greedy("llama3-rope"),
    greedy("phi3"),
    greedy("phi3-q4"),
    greedy("gemma3_text"),
    greedy("gemma3_text-q4"),
    greedy("gemma3_text-bf16"),
    greedy("gemma3_text-f16"),
    greedy("gemma3"),
    greedy("gemma3-q8"),
    greedy("qwen3_moe"),
    greedy("qwen3_moe-q4"),
    greedy("qwen3_moe-q8"),
    greedy("gpt_oss"),
    greedy("gpt_oss-q4"),
    greedy("gpt_oss-mxfp4"),
    greedy("mimo"),
    greedy("mimo-q4"),
    Case {
        model: "llama",
        temp: 0.8,
        top_p: 0.9,
        top_k: 40,
        min_p: 0.02,
        seed: 42,
    },
    Case {
        model: "qwen3-q4",
        temp: 1.0,
        top_p: 0.0,
        top_k: 0,
        min_p: 0.0,
        seed: 7,
    },
];

/// A chat template rendered by both transformers and native-mlx.
pub struct ChatCase {
    pub name: &'static str,
    pub template: &'static str,
    /// The messages, as JSON.
    pub messages: &'static str,
    pub tools: Option<&'static str>,
    pub add_generation_prompt: bool,
}

/// Templates written for the test (not copied from models) that use what
/// real templates use: whitespace control, `trim_blocks`/`lstrip_blocks`
/// layouts, `namespace`, Python string methods, `tojson` of tool calls and
/// schemas, loop controls and `raise_exception`.
pub const CHATS: &[ChatCase] = &[
    ChatCase {
        name: "header-style with trim",
        template: "{{- bos_token }}\n{%- for message in messages %}\n    {{- '<|start|>' + message['role'] + '<|sep|>\\n\\n' + message['content'] | trim + '<|eot|>' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start|>assistant<|sep|>\\n\\n' }}\n{%- endif %}\n",
        messages: r#"[{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Hi\n"}]"#,
        tools: None,
        add_generation_prompt: true,
    },
    ChatCase {
        name: "block layout",
        template: "{% for m in messages %}\n    {% if m.role == 'system' %}\n<<SYS>>{{ m.content }}<</SYS>>\n    {% elif m.role == 'user' %}\n[{{ m.role | upper }}] {{ m.content.strip() }}\n    {% else %}\n{{ m.content }}{{ eos_token }}\n    {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}[ASSISTANT]{% endif %}",
        messages: r#"[{"role": "system", "content": "S"}, {"role": "user", "content": " question "}, {"role": "assistant", "content": "answer"}, {"role": "user", "content": "again"}]"#,
        tools: None,
        add_generation_prompt: false,
    },
    ChatCase {
        name: "tools and tool calls",
        template: concat!(
            "{%- set ns = namespace(last_user=0) %}",
            "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}",
            "{%- if tools %}<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n{%- endif %}",
            "{%- for m in messages %}",
            "{%- if m.role == 'assistant' and m.tool_calls is defined %}",
            "{%- for call in m.tool_calls %}<call>{{ call.function.name }}:{{ call.function.arguments | tojson }}</call>{%- if loop.last %}{% break %}{% endif %}{%- endfor %}",
            "{%- elif m.role == 'assistant' %}{{ m.content.split('</think>')[-1].lstrip('\\n') }}",
            "{%- else %}<{{ m.role }}{{ '*' if loop.index0 == ns.last_user else '' }}>{{ m.content }}",
            "{%- endif %}\n{%- endfor %}",
            "{%- if add_generation_prompt %}<assistant>{% endif %}"
        ),
        messages: r#"[{"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"unit": "c", "city": "Zürich"}}}]},
            {"role": "tool", "content": "{\"t\": 21}"},
            {"role": "assistant", "content": "<think>hm</think>\n\nIt is 21 °C."},
            {"role": "user", "content": "Thanks <3"}]"#,
        tools: Some(r#"[{"type": "function", "function": {"name": "get_weather", "description": "Weather & more", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}]"#),
        add_generation_prompt: true,
    },
    ChatCase {
        name: "raise_exception",
        template: "{%- if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{%- endif %}{{ messages[0]['content'] }}",
        messages: r#"[{"role": "system", "content": "S"}]"#,
        tools: None,
        add_generation_prompt: true,
    },
];

pub struct Fixtures {
    dir: tempfile::TempDir,
    /// mlx-lm's ids for each entry of [`CASES`].
    pub reference: Vec<Vec<u32>>,
    /// transformers' rendering of each entry of [`CHATS`]: the text, or
    /// `{"error": message}`.
    pub chats: Vec<Value>,
}

impl Fixtures {
    /// The folder of fixture `name` (an absolute path is taken as it is).
    pub fn model(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Builds the models and runs mlx-lm once for the whole test binary.
pub fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(build)
}

/// The repository: `HANGAR_REPO`, for a test binary carried to another
/// machine (scripts/gpu-device.sh), or where this one was built.
pub fn repo() -> PathBuf {
    std::env::var_os("HANGAR_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

pub fn python() -> PathBuf {
    let python = std::env::var_os("HANGAR_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"));
    assert!(
        python.exists(),
        "{} not found: run scripts/python-env.sh (or set HANGAR_PYTHON)",
        python.display()
    );
    python
}

/// With `HANGAR_FIXTURES_LOG` set, a progress line on stderr (run the tests
/// with `--nocapture` to see it live): where another machine spends its time.
fn progress(start: std::time::Instant, what: &str) {
    if std::env::var_os("HANGAR_FIXTURES_LOG").is_some() {
        eprintln!("fixtures: {:7.1} s {what}", start.elapsed().as_secs_f64());
    }
}

/// The fixtures' width: 128 wide, 2 query heads over 1 key/value head, of
/// 64 (mlx-lm's Qwen2, Phi-3 and MiMo take the heads' width as the hidden
/// size over the heads). Every product of a quantized fixture then sums
/// over more than one quantization group (64), as in any real model. At 64
/// wide (one group per row), MLX 0.32's CUDA build takes, for more than one row, a kernel that
/// no real model reaches (`qmm_sm90`, on Hopper: `supports_qmm_sm90` wants
/// the group at least as long as the row); on an H200 both mlx-lm and
/// native-mlx then gave degenerate ids (token 0 repeated) for the float32
/// 4- and 8-bit fixtures, at random, and batched ids far from the
/// session's. Heads of 64, as real models have (not 16, as before): MLX
/// 0.32's CUDA RoPE sizes its thread block from the rotated width and the
/// rows (`get_block_dims_common`: 8 rotated pairs and 64 or more rows give
/// a block 128 deep, past CUDA's 64), so on a GPU every step of 64 rows
/// or more failed (`cudaGraphAddKernelNode ... invalid argument`); and
/// the paged attention kernel, which takes heads of 64 or 128 only, now
/// serves the fixtures on a GPU as it serves real models.
pub const WIDTH: [&str; 6] = ["--hidden", "128", "--heads", "2", "--kv-heads", "1"];

/// The vision fixtures' tower (`make_tiny_model.py --vision`): 128 wide
/// (2 heads of 64), its MLP 256, so that a quantized tower's products are
/// two groups of 64 long or more, as real towers' are (SigLIP's: 1152).
/// At 64 wide (one group) MLX 0.32's CUDA build multiplies them with
/// `qmm_sm90`, which the text fixtures left for giving degenerate ids (see
/// `WIDTH`'s history in the README); there the 8-bit tower's answers
/// changed from run to run on a GPU (stop 55).
pub const VISION_WIDTH: [&str; 4] = ["--vision-hidden", "128", "--vision-intermediate", "256"];

fn build() -> Fixtures {
    let start = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let models = [
        ("llama", "llama", "float32"),
        ("qwen2", "qwen2", "float32"),
        ("qwen3", "qwen3", "float32"),
        ("mistral", "mistral", "float32"),
        ("llama-bf16", "llama", "bfloat16"),
        ("qwen3-f16", "qwen3", "float16"),
        ("qwen3_moe", "qwen3_moe", "float32"),
        ("gpt_oss", "gpt_oss", "float32"),
        ("mimo", "mimo", "float32"),
    ];
    for (name, arch, dtype) in models {
        let status = Command::new(python())
            .arg(repo().join("scripts/make_tiny_model.py"))
            .arg(root.join(name))
            .args(["--arch", arch, "--dtype", dtype])
            .args(WIDTH)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "make_tiny_model.py {name} failed");
        progress(start, &format!("made {name}"));
    }
    // Three layers of Gemma 3: sliding, global, sliding (a window of 8).
    let more = [
        ("phi3", "phi3", "float32", 2),
        ("gemma3_text", "gemma3_text", "float32", 3),
        ("gemma3_text-bf16", "gemma3_text", "bfloat16", 3),
        ("gemma3_text-f16", "gemma3_text", "float16", 3),
        ("gemma3", "gemma3", "float32", 3),
    ];
    for (name, arch, dtype, layers) in more {
        let status = Command::new(python())
            .arg(repo().join("scripts/make_tiny_model.py"))
            .arg(root.join(name))
            .args(["--arch", arch, "--dtype", dtype, "--layers"])
            .arg(layers.to_string())
            .args(WIDTH)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "make_tiny_model.py {name} failed");
        progress(start, &format!("made {name}"));
    }
    variant(root, "llama", "llama-tied", |config| {
        config["tie_word_embeddings"] = json!(true);
    });
    // Boundaries inside the 32 frequencies of head_dim 64 (wavelengths 6
    // to 47 000), so every branch of the scaling is taken.
    variant(root, "llama", "llama3-rope", |config| {
        config["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64});
    });

    let mut convert: Vec<Value> = [
        ("llama", 4),
        ("llama", 8),
        ("qwen2", 4),
        ("qwen3", 4),
        ("llama-tied", 4),
        ("phi3", 4),
        ("gemma3_text", 4),
        ("gemma3", 8),
        ("qwen3_moe", 4),
        ("qwen3_moe", 8),
        ("gpt_oss", 4),
        ("mimo", 4),
    ]
    .iter()
    .map(|(model, bits)| {
        json!({"hf_path": root.join(model), "mlx_path": root.join(format!("{model}-q{bits}")), "bits": bits})
    })
    .collect();
    // MXFP4, as gpt-oss ships its experts (mlx-lm's converter keeps the
    // router in 8-bit affine and packs every other layer so).
    convert.push(
        json!({"hf_path": root.join("gpt_oss"), "mlx_path": root.join("gpt_oss-mxfp4"),
        "bits": 4, "mode": "mxfp4"}),
    );
    let cases: Vec<Value> = CASES
        .iter()
        .map(|c| {
            json!({"model": root.join(c.model), "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                "temp": c.temp, "top_p": c.top_p, "top_k": c.top_k, "min_p": c.min_p, "seed": c.seed})
        })
        .collect();
    let chats: Vec<Value> = CHATS
        .iter()
        .map(|c| {
            json!({"model": root.join("llama"), "template": c.template,
                "messages": serde_json::from_str::<Value>(c.messages).unwrap(),
                "tools": c.tools.map(|t| serde_json::from_str::<Value>(t).unwrap()),
                "add_generation_prompt": c.add_generation_prompt})
        })
        .collect();
    let mut answer = reference(json!({"convert": convert, "cases": cases, "chats": chats}));
    progress(start, "mlx-lm reference done");
    Fixtures {
        dir,
        reference: serde_json::from_value(answer["ids"].take()).unwrap(),
        chats: serde_json::from_value(answer["chats"].take()).unwrap(),
    }
}

/// Runs `tests/mlx_lm_reference.py` on `request` (see its docstring) and
/// returns its answer.
pub fn reference(request: Value) -> Value {
    python_reference("mlx_lm_reference.py", &request)
}

/// Runs the Python reference `tests/{script}` with `request` as JSON on its
/// standard input and returns the JSON it prints; its error output is shown
/// when it fails.
pub fn python_reference(script: &str, request: &Value) -> Value {
    // HANGAR_FIXTURES_LOG shows the reference's progress as it runs: where
    // another machine spends its time (scripts/gpu-device.sh sets it).
    let stderr = if std::env::var_os("HANGAR_FIXTURES_LOG").is_some() {
        Stdio::inherit()
    } else {
        Stdio::piped()
    };
    let mut child = Command::new(python())
        .arg(repo().join("plugins/native-mlx/tests").join(script))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Copies model `from` to `to`, editing its config.json.
fn variant(root: &Path, from: &str, to: &str, edit: impl FnOnce(&mut Value)) {
    copy_with(&root.join(from), &root.join(to), "config.json", edit);
}

/// A copy of fixture model `from` in its own folder, with `file` (a JSON
/// file of the model) edited.
pub fn edited_copy(from: &str, file: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_with(&fixtures().model(from), dir.path(), file, edit);
    dir
}

fn copy_with(from: &Path, to: &Path, file: &str, edit: impl FnOnce(&mut Value)) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
    let path = to.join(file);
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(path, json.to_string()).unwrap();
}
