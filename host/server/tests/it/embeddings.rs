//! Embeddings and rerank through `hangar serve`: the example `echo` engine
//! embeds and reranks in process (in a worker, and inside the host), so
//! that the routes' contract (inputs, encodings, refusals, kinds, sorting)
//! is checked against a real server without a real model. The vectors a
//! real model computes are checked in the end-to-end suite.

use base64::Engine as _;
use serde_json::{json, Value};

use crate::fixtures::{manifest, Scenario, ECHO_EXTRA};
use crate::serve::{model, Server};

/// `echo`, with its embeddings and rerank capabilities, serving `tiny`
/// (chat), `bert` (an embedder: an encoder's config), `mrl` (an embedder
/// trained for shorter vectors) and `ranker` (a cross-encoder).
fn serve(isolation: &str) -> Server {
    Server::with(|s: &Scenario| {
        s.plugin(
            "echo",
            &manifest("echo", "engine_echo", &["mlx"], 50, ECHO_EXTRA),
            Some("engine_echo"),
        );
        s.config(&format!("[plugins.echo]\nisolation = \"{isolation}\"\n"));
        for (name, config) in [
            (
                "bert",
                r#"{"model_type": "bert", "architectures": ["BertModel"]}"#,
            ),
            (
                "mrl",
                r#"{"model_type": "bert", "matryoshka_dimensions": [8, 4, 2]}"#,
            ),
            (
                "ranker",
                r#"{"model_type": "xlm-roberta", "architectures": ["XLMRobertaForSequenceClassification"]}"#,
            ),
        ] {
            model(s, name, 0);
            let path = s.root.path().join("models").join(name).join("config.json");
            std::fs::write(path, config).unwrap();
        }
    })
}

/// The embeddings of an OpenAI answer; an answer without them (an error)
/// fails the test with the answer.
fn vectors(body: &Value) -> Vec<Vec<f64>> {
    body["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no embeddings in {body}"))
        .iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn embeddings_follow_openais_contract_in_a_worker_and_in_the_host() {
    for isolation in ["worker", "none"] {
        let server = serve(isolation);
        let (status, models) = server.get("/v1/models");
        assert_eq!(status, 200);
        let kinds: Vec<(String, String)> = models["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["id"].as_str().unwrap().into(),
                    m["kind"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("bert", "embedding"),
                ("mrl", "embedding"),
                ("ranker", "rerank"),
                ("tiny", "chat")
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );

        let (status, one) = server.post(
            "/v1/embeddings",
            json!({"model": "bert", "input": "the cat sat"}),
        );
        assert_eq!(status, 200, "{isolation}: {one}");
        assert_eq!(one["object"], "list");
        assert_eq!(one["model"], "bert");
        assert_eq!(one["data"][0]["object"], "embedding");
        assert_eq!(one["data"][0]["index"], 0);
        assert_eq!(one["usage"], json!({"prompt_tokens": 3, "total_tokens": 3}));
        let v = &vectors(&one)[0];
        assert_eq!(v.len(), 8);
        assert!((v.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-6);

        // A batch is the inputs one by one, in order.
        let texts = ["a b", "the cat sat", "x y z w"];
        let (_, batch) = server.post("/v1/embeddings", json!({"model": "bert", "input": texts}));
        let batch = vectors(&batch);
        for (i, text) in texts.iter().enumerate() {
            let (_, alone) = server.post("/v1/embeddings", json!({"model": "bert", "input": text}));
            assert_eq!(vectors(&alone)[0], batch[i], "{isolation}: input {i}");
        }

        // base64 is the same float32s.
        let (_, encoded) = server.post(
            "/v1/embeddings",
            json!({"model": "bert", "input": texts, "encoding_format": "base64"}),
        );
        for (i, item) in encoded["data"].as_array().unwrap().iter().enumerate() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(item["embedding"].as_str().unwrap())
                .unwrap();
            let floats: Vec<f64> = bytes
                .chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect();
            let expected: Vec<f64> = batch[i].iter().map(|&x| x as f32 as f64).collect();
            assert_eq!(floats, expected);
        }

        // Token ids, flat (one input) and nested.
        let (status, ids) = server.post(
            "/v1/embeddings",
            json!({"model": "bert", "input": [1, 9, 17]}),
        );
        assert_eq!(status, 200, "{ids}");
        assert_eq!(
            vectors(&ids)[0][1],
            1.0,
            "ids 1, 9 and 17 all fall in bucket 1"
        );
        let (_, nested) = server.post(
            "/v1/embeddings",
            json!({"model": "bert", "input": [[1], [2, 3]]}),
        );
        assert_eq!(vectors(&nested).len(), 2);

        // The engine's refusal names the input; nothing is truncated.
        let long = vec!["w"; 33].join(" ");
        let (status, refused) = server.post(
            "/v1/embeddings",
            json!({"model": "bert", "input": ["short", long]}),
        );
        assert_eq!(status, 400, "{refused}");
        assert_eq!(refused["error"]["param"], "input");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("'input[1]'") && message.contains("33 tokens"),
            "{message}"
        );

        // dimensions: the model's own, or one it was trained for.
        let (status, _) = server.post(
            "/v1/embeddings",
            json!({"model": "bert", "input": "a", "dimensions": 8}),
        );
        assert_eq!(status, 200);
        let (status, e) = server.post(
            "/v1/embeddings",
            json!({"model": "bert", "input": "a", "dimensions": 4}),
        );
        assert_eq!(status, 400, "{e}");
        assert_eq!(e["error"]["param"], "dimensions");
        let (status, short) = server.post(
            "/v1/embeddings",
            json!({"model": "mrl", "input": "a b c d e f g h", "dimensions": 4}),
        );
        assert_eq!(status, 200, "{short}");
        let v = &vectors(&short)[0];
        assert_eq!(v.len(), 4);
        assert!(
            (v.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-6,
            "re-normalised"
        );
        let (status, e) = server.post(
            "/v1/embeddings",
            json!({"model": "mrl", "input": "a", "dimensions": 3}),
        );
        assert_eq!(
            (status, e["error"]["param"].clone()),
            (400, json!("dimensions"))
        );
        let (status, _) = server.post(
            "/v1/embeddings",
            json!({"model": "mrl", "input": "a", "dimensions": 9}),
        );
        assert_eq!(status, 400);
    }
}

#[test]
fn requests_of_the_wrong_kind_or_shape_are_the_clients_400s() {
    let server = serve("worker");
    let wrong = [
        (
            "/v1/embeddings",
            json!({"model": "tiny", "input": "hi"}),
            "'tiny' is a chat model",
        ),
        (
            "/v1/embeddings",
            json!({"model": "ranker", "input": "hi"}),
            "'ranker' is a rerank model",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "bert", "messages": [{"role": "user", "content": "hi"}]}),
            "'bert' is an embedding model",
        ),
        (
            "/v1/completions",
            json!({"model": "bert", "prompt": "hi"}),
            "embeddings (/v1/embeddings)",
        ),
        (
            "/v1/rerank",
            json!({"model": "bert", "query": "q", "documents": ["d"]}),
            "not /v1/rerank",
        ),
    ];
    for (route, body, says) in wrong {
        let (status, e) = server.post(route, body);
        assert_eq!(status, 400, "{route}: {e}");
        assert_eq!(e["error"]["code"], "wrong_model_kind", "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(says),
            "{e}"
        );
    }
    let malformed = [
        (json!({"model": "bert"}), "input"),
        (json!({"model": "bert", "input": ""}), "input"),
        (json!({"model": "bert", "input": []}), "input"),
        (json!({"model": "bert", "input": [1, -1]}), "input"),
        (
            json!({"model": "bert", "input": "a", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (
            json!({"model": "bert", "input": "a", "dimensions": 0}),
            "dimensions",
        ),
        (json!({"input": "a"}), "model"),
    ];
    for (body, field) in malformed {
        let (status, e) = server.post("/v1/embeddings", body.clone());
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(e["error"]["param"], field, "{body}: {e}");
    }
    let (status, e) = server.post(
        "/v1/embeddings",
        json!({"model": "bert", "input": "a", "truncate": true}),
    );
    assert_eq!(status, 400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'truncate'"),
        "{e}"
    );
    let (status, e) = server.post("/v1/embeddings", json!({"model": "nope", "input": "a"}));
    assert_eq!(status, 404, "{e}");
}

#[test]
fn rerank_sorts_best_first_and_ollama_embeds_the_same_vectors() {
    let server = serve("worker");
    let documents = ["a cat", "the cat sat on the mat", "dogs bark", "the cat"];
    let (status, body) = server.post(
        "/v1/rerank",
        json!({"model": "ranker", "query": "the cat sat", "documents": documents}),
    );
    assert_eq!(status, 200, "{body}");
    let order: Vec<u64> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    // Scores 1, 3, 0, 2 words of the query: best first.
    assert_eq!(order, [1, 3, 0, 2]);
    let score = |i: usize| body["results"][i]["relevance_score"].as_f64().unwrap();
    assert!((score(0) - 1.0 / (1.0 + (-3f64).exp())).abs() < 1e-6);
    assert_eq!(body["results"][0]["document"]["text"], documents[1]);
    assert!(body["usage"]["total_tokens"].as_u64().unwrap() > 0);

    let (status, top) = server.post(
        "/v1/rerank",
        json!({"model": "ranker", "query": "the cat sat", "documents": documents, "top_n": 2, "return_documents": false}),
    );
    assert_eq!(status, 200, "{top}");
    assert_eq!(top["results"].as_array().unwrap().len(), 2);
    assert!(top["results"][0].get("document").is_none(), "{top}");
    for (body, field) in [
        (
            json!({"model": "ranker", "query": "", "documents": ["d"]}),
            "query",
        ),
        (
            json!({"model": "ranker", "query": "q", "documents": []}),
            "documents",
        ),
        (
            json!({"model": "ranker", "query": "q", "documents": ["d", ""]}),
            "documents",
        ),
        (
            json!({"model": "ranker", "query": "q", "documents": ["d"], "top_n": 0}),
            "top_n",
        ),
    ] {
        let (status, e) = server.post("/v1/rerank", body.clone());
        assert_eq!(
            (status, e["error"]["param"].clone()),
            (400, json!(field)),
            "{body}: {e}"
        );
    }

    let texts = ["the cat sat", "dogs bark"];
    let (status, openai) = server.post("/v1/embeddings", json!({"model": "bert", "input": texts}));
    assert_eq!(status, 200, "{openai}");
    let (status, ollama) = server.post(
        "/ollama/api/embed",
        json!({"model": "bert", "input": texts}),
    );
    assert_eq!(status, 200, "{ollama}");
    assert_eq!(ollama["model"], "bert");
    let from_ollama: Vec<Vec<f64>> = serde_json::from_value(ollama["embeddings"].clone()).unwrap();
    assert_eq!(from_ollama, vectors(&openai));
    assert_eq!(ollama["prompt_eval_count"], 5);
    let (status, old) = server.post(
        "/ollama/api/embeddings",
        json!({"model": "bert", "prompt": "dogs bark"}),
    );
    assert_eq!(status, 200, "{old}");
    let from_old: Vec<f64> = serde_json::from_value(old["embedding"].clone()).unwrap();
    assert_eq!(from_old, vectors(&openai)[1]);
    let (status, e) = server.post("/ollama/api/embed", json!({"model": "tiny", "input": "hi"}));
    assert_eq!(status, 400);
    assert!(e["error"].as_str().unwrap().contains("chat model"), "{e}");
}
