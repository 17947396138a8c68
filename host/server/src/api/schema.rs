//! The JSON bodies of the API as OpenAPI schemas: what the handlers read
//! and write, spelled out as types for `#[utoipa::path]` (the handlers
//! themselves work on `serde_json` values, so that every field is checked
//! by the edge's own rules with messages naming it). Imports nothing of the
//! handlers: they refer to these, and `openapi.rs` gathers both.

#![allow(dead_code)] // The types exist for their schemas.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

// ---------------------------------------------------------------------------
// errors

/// An error, in OpenAI's shape (every route but `/v1/messages`).
#[derive(Serialize, ToSchema)]
pub(super) struct Error {
    error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ErrorDetail {
    /// What happened and what to do.
    message: String,
    #[serde(rename = "type")]
    kind: String,
    /// The request field concerned.
    param: Option<String>,
    code: Option<ErrorCode>,
}

/// The host's codes are strings; an engine's own error passes on as the
/// engine sent it (llama-server's `code` is the HTTP status, a number).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum ErrorCode {
    Text(String),
    Number(i64),
}

/// An error, in Anthropic's shape (`/v1/messages`).
#[derive(Serialize, ToSchema)]
pub(super) struct AnthropicError {
    /// Always `error`.
    #[serde(rename = "type")]
    kind: String,
    error: AnthropicErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub(super) struct AnthropicErrorDetail {
    /// `invalid_request_error`, `authentication_error`, `not_found_error`,
    /// `request_too_large`, `rate_limit_error`, `overloaded_error`, `api_error`.
    #[serde(rename = "type")]
    kind: String,
    message: String,
}

/// One server-sent event of a stream (`event:` named on `/v1/messages`;
/// `data` is a JSON object, or `[DONE]` at the end of an OpenAI stream).
#[derive(Serialize, ToSchema)]
pub(super) struct SseEvent {
    event: Option<String>,
    data: String,
    id: Option<String>,
    retry: Option<u64>,
}

// ---------------------------------------------------------------------------
// the OpenAI routes

/// `GET /v1/models`.
#[derive(Serialize, ToSchema)]
pub(super) struct ModelList {
    object: String,
    data: Vec<ModelEntry>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ModelEntry {
    id: String,
    object: String,
    created: u64,
    owned_by: String,
    /// The model's format (`mlx`, `gguf`, ...).
    format: String,
    /// What it serves: `chat` (chat and completions), `embedding`
    /// (`/v1/embeddings`) or `rerank` (`/v1/rerank`).
    kind: ModelKindName,
    /// For an alias: the model it names.
    #[serde(skip_serializing_if = "Option::is_none")]
    alias_of: Option<String>,
    /// For a profile (`MODEL:PROFILE`): the model it runs on.
    #[serde(skip_serializing_if = "Option::is_none")]
    profile_of: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum ModelKindName {
    Chat,
    Embedding,
    Rerank,
}

/// `POST /v1/embeddings`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EmbeddingRequest {
    /// An embedding model (`kind: embedding` in `GET /v1/models`).
    #[schema(min_length = 1)]
    model: String,
    input: EmbeddingInput,
    encoding_format: Option<EncodingFormat>,
    /// Fewer dimensions than the model computes, where its config declares
    /// matryoshka dimensions.
    #[schema(minimum = 1, maximum = 4294967295_u64)]
    dimensions: Option<u64>,
    user: Option<String>,
}

/// A string, a list of strings, a list of token ids or a list of lists of
/// token ids (at most 2048 inputs; no empty one).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum EncodingFormat {
    Float,
    /// Little-endian float32s, base64-encoded.
    Base64,
}

/// The answer of `POST /v1/embeddings`.
#[derive(Serialize, ToSchema)]
pub(super) struct EmbeddingList {
    object: String,
    data: Vec<EmbeddingItem>,
    model: String,
    usage: EmbeddingUsage,
}

#[derive(Serialize, ToSchema)]
pub(super) struct EmbeddingItem {
    object: String,
    index: u32,
    /// Numbers, or a base64 string with `encoding_format: base64`.
    embedding: Value,
}

#[derive(Serialize, ToSchema)]
pub(super) struct EmbeddingUsage {
    prompt_tokens: u32,
    total_tokens: u32,
}

/// `POST /v1/rerank`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RerankRequest {
    /// A reranker (`kind: rerank` in `GET /v1/models`).
    #[schema(min_length = 1)]
    model: String,
    #[schema(min_length = 1)]
    query: String,
    /// Strings or `{"text": ...}` objects (at most 1024).
    #[schema(min_items = 1, max_items = 1024)]
    documents: Vec<RerankDocumentIn>,
    /// How many results (all when absent).
    #[schema(minimum = 1)]
    top_n: Option<u64>,
    /// Whether each result carries its document's text (default true).
    return_documents: Option<bool>,
}

/// The answer of `POST /v1/rerank`: best first.
#[derive(Serialize, ToSchema)]
pub(super) struct RerankAnswer {
    id: String,
    model: String,
    results: Vec<RerankResult>,
    usage: EmbeddingUsage,
}

#[derive(Serialize, ToSchema)]
pub(super) struct RerankResult {
    /// The document's index in the request.
    index: u32,
    /// The cross-encoder's score through the logistic function (0..1).
    relevance_score: f32,
    document: Option<RerankDocument>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct RerankDocument {
    text: String,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum RerankDocumentIn {
    Text(String),
    Object(RerankDocument),
}

/// The sampling fields both completion routes take (unknown fields pass on
/// to the engine).
#[derive(Serialize, ToSchema)]
pub(super) struct Sampling {
    #[schema(minimum = 1, maximum = 4294967295_u64)]
    max_tokens: Option<u64>,
    #[schema(minimum = 1, maximum = 4294967295_u64)]
    max_completion_tokens: Option<u64>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    temperature: Option<f64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    top_p: Option<f64>,
    #[schema(minimum = 0, maximum = 4294967295_u64)]
    top_k: Option<u64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    min_p: Option<f64>,
    #[schema(minimum = 1, maximum = 128)]
    n: Option<u64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    presence_penalty: Option<f64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    frequency_penalty: Option<f64>,
    seed: Option<i64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    /// A string or a list of strings.
    stop: Option<Stop>,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Serialize, ToSchema)]
pub(super) struct StreamOptions {
    include_usage: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Serialize, ToSchema)]
pub(super) struct ChatRequest {
    /// One of the ids `GET /v1/models` lists.
    #[schema(min_length = 1)]
    model: String,
    #[schema(min_items = 1)]
    messages: Vec<ChatMessage>,
    #[serde(flatten)]
    sampling: Sampling,
    /// Functions the model may call; refused (400) where the engine lacks
    /// the `tool_calls` capability or the model's chat template does not
    /// render tools.
    tools: Option<Vec<Tool>>,
    /// `auto` (the default), `none`, `required`, or a named function; the
    /// last two need the engine's `structured_output` capability.
    tool_choice: Option<ToolChoice>,
    /// `false` keeps only the answer's first call.
    parallel_tool_calls: Option<bool>,
    /// `json_object` and `json_schema` need the engine's
    /// `structured_output` capability.
    response_format: Option<ResponseFormat>,
    /// Text the answer is expected to resemble (Predicted Outputs): an
    /// engine that speculates verifies its tokens several per pass; the
    /// answer is the same. Others ignore it.
    prediction: Option<Prediction>,
}

/// OpenAI's `prediction`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Prediction {
    #[serde(rename = "type")]
    kind: PredictionType,
    content: PredictionContent,
}

/// The one kind of prediction.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum PredictionType {
    Content,
}

/// A prediction's text: a string, or text parts.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum PredictionContent {
    Text(String),
    Parts(Vec<PredictionPart>),
}

/// One text part of a prediction (other fields are ignored, as in
/// message content parts).
#[derive(Serialize, ToSchema)]
pub(super) struct PredictionPart {
    #[serde(rename = "type")]
    kind: TextType,
    text: String,
}

/// The one kind of prediction part.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum TextType {
    Text,
}

/// A function the model may call.
#[derive(Serialize, ToSchema)]
pub(super) struct Tool {
    #[serde(rename = "type")]
    kind: FunctionType,
    function: FunctionSpec,
}

/// The one kind of tool.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum FunctionType {
    Function,
}

#[derive(Serialize, ToSchema)]
pub(super) struct FunctionSpec {
    /// Unique among the request's tools.
    #[schema(pattern = r"^[A-Za-z0-9_\-]{1,64}$")]
    name: String,
    description: Option<String>,
    /// A JSON Schema of the arguments.
    parameters: Option<BTreeMap<String, Value>>,
    strict: Option<bool>,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum ToolChoice {
    /// `auto`, `none` or `required`.
    Mode(ToolChoiceMode),
    /// This function (one of `tools`).
    Named(NamedFunction),
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum ToolChoiceMode {
    Auto,
    None,
    Required,
}

#[derive(Serialize, ToSchema)]
pub(super) struct NamedFunction {
    #[serde(rename = "type")]
    kind: FunctionType,
    function: FunctionName,
}

#[derive(Serialize, ToSchema)]
pub(super) struct FunctionName {
    name: String,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ResponseFormat {
    #[serde(rename = "type")]
    kind: ResponseFormatType,
    /// With `json_schema`: `{"name", "schema", "strict"}`.
    json_schema: Option<JsonSchemaFormat>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum ResponseFormatType {
    Text,
    JsonObject,
    JsonSchema,
}

#[derive(Serialize, ToSchema)]
pub(super) struct JsonSchemaFormat {
    name: String,
    schema: Option<BTreeMap<String, Value>>,
    strict: Option<bool>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ChatMessage {
    role: String,
    /// A string, a list of content parts (objects with a `type`), or null.
    content: Option<ChatContent>,
    /// An assistant turn's calls, as an answer gave them.
    tool_calls: Option<Vec<ToolCall>>,
    /// A `tool` message: the id of the call it answers (required there).
    tool_call_id: Option<String>,
}

/// A tool call, in an answer or in the history.
#[derive(Serialize, ToSchema)]
pub(super) struct ToolCall {
    id: String,
    #[serde(rename = "type")]
    kind: Option<String>,
    function: CalledFunction,
}

#[derive(Serialize, ToSchema)]
pub(super) struct CalledFunction {
    name: String,
    /// The arguments, as JSON text.
    arguments: String,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum ChatContent {
    Text(String),
    Parts(Vec<BTreeMap<String, Value>>),
}

/// `POST /v1/completions`.
#[derive(Serialize, ToSchema)]
pub(super) struct CompletionRequest {
    #[schema(min_length = 1)]
    model: String,
    /// A string, a list of strings, or a list of token ids.
    prompt: Prompt,
    #[serde(flatten)]
    sampling: Sampling,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Serialize, ToSchema)]
pub(super) struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    /// Where a prediction was verified: its tokens kept and rejected.
    completion_tokens_details: Option<CompletionTokensDetails>,
    /// Where the engine speculated: verifying passes, tokens proposed and kept.
    speculation: Option<SpeculationCounts>,
}

/// OpenAI's `usage.completion_tokens_details`.
#[derive(Serialize, ToSchema)]
pub(super) struct CompletionTokensDetails {
    accepted_prediction_tokens: Option<u64>,
    rejected_prediction_tokens: Option<u64>,
}

/// Hangar's `usage.speculation`.
#[derive(Serialize, ToSchema)]
pub(super) struct SpeculationCounts {
    verifications: u64,
    proposed_tokens: u64,
    accepted_tokens: u64,
}

/// A whole chat answer (a stream is `text/event-stream` of
/// `chat.completion.chunk` events and `data: [DONE]`).
#[derive(Serialize, ToSchema)]
pub(super) struct ChatCompletion {
    id: String,
    object: String,
    created: u64,
    model: String,
    choices: Vec<ChatChoice>,
    usage: Option<Usage>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ChatChoice {
    index: u64,
    message: AssistantMessage,
    finish_reason: Option<String>,
}

/// The answer; `finish_reason` is `tool_calls` when it called tools.
#[derive(Serialize, ToSchema)]
pub(super) struct AssistantMessage {
    role: String,
    content: Option<String>,
    /// The model's reasoning, for models whose template marks it.
    reasoning_content: Option<String>,
    tool_calls: Option<Vec<ToolCall>>,
}

/// A whole completion.
#[derive(Serialize, ToSchema)]
pub(super) struct Completion {
    id: String,
    object: String,
    created: u64,
    model: String,
    choices: Vec<CompletionChoice>,
    usage: Option<Usage>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct CompletionChoice {
    index: u64,
    text: String,
    finish_reason: Option<String>,
}

// ---------------------------------------------------------------------------
// the Anthropic route

/// `POST /v1/messages`. Fields not listed are refused.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MessagesRequest {
    #[schema(min_length = 1)]
    model: String,
    #[schema(min_items = 1)]
    messages: Vec<Turn>,
    #[schema(minimum = 1, maximum = 4294967295_u64)]
    max_tokens: u64,
    /// A string or a list of text blocks.
    system: Option<TextOrBlocks>,
    stop_sequences: Option<Vec<StopSequence>>,
    stream: Option<bool>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    temperature: Option<f64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    top_p: Option<f64>,
    #[schema(minimum = 0, maximum = 4294967295_u64)]
    top_k: Option<u64>,
    metadata: Option<Metadata>,
    /// Client tools; refused (400) where the engine lacks the `tool_calls`
    /// capability or the model's template does not render tools.
    tools: Option<Vec<AnthropicTool>>,
    /// `any` and `tool` need the engine's `structured_output` capability.
    tool_choice: Option<AnthropicToolChoice>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct AnthropicTool {
    #[schema(min_length = 1)]
    name: String,
    description: Option<String>,
    /// A JSON Schema of the input.
    input_schema: BTreeMap<String, Value>,
    /// Client tools only.
    #[serde(rename = "type")]
    kind: Option<CustomType>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum CustomType {
    Custom,
}

#[derive(Serialize, ToSchema)]
pub(super) struct AnthropicToolChoice {
    #[serde(rename = "type")]
    kind: AnthropicChoiceType,
    /// With `tool`: the tool's name.
    name: Option<String>,
    disable_parallel_tool_use: Option<bool>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum AnthropicChoiceType {
    Auto,
    Any,
    Tool,
    None,
}

#[derive(Serialize, ToSchema)]
pub(super) struct Metadata {
    user_id: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct Turn {
    role: Role,
    content: TurnContent,
}

/// A turn's content: a string, or blocks (`tool_use` and `thinking` in
/// assistant turns, `tool_result` in user turns).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum TurnContent {
    Text(String),
    /// Not empty.
    Blocks(Vec<Block>),
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum Block {
    Text(TextBlock),
    ToolUse(ToolUseBlock),
    ToolResult(ToolResultBlock),
    Thinking(ThinkingBlock),
    RedactedThinking(RedactedThinkingBlock),
}

/// Reasoning an earlier answer gave encrypted; sent back, it is dropped.
#[derive(Serialize, ToSchema)]
pub(super) struct RedactedThinkingBlock {
    #[serde(rename = "type")]
    kind: RedactedThinkingType,
    data: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum RedactedThinkingType {
    RedactedThinking,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ToolUseBlock {
    #[serde(rename = "type")]
    kind: ToolUseType,
    id: String,
    name: String,
    input: BTreeMap<String, Value>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum ToolUseType {
    ToolUse,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ToolResultBlock {
    #[serde(rename = "type")]
    kind: ToolResultType,
    tool_use_id: String,
    /// A string or a list of text blocks.
    content: Option<TextOrBlocks>,
    is_error: Option<bool>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum ToolResultType {
    ToolResult,
}

/// The model's reasoning: `signature` is empty (no engine here signs it).
#[derive(Serialize, ToSchema)]
pub(super) struct ThinkingBlock {
    #[serde(rename = "type")]
    kind: ThinkingType,
    thinking: String,
    signature: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum ThinkingType {
    Thinking,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum Role {
    User,
    Assistant,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum TextOrBlocks {
    Text(String),
    /// Not empty.
    Blocks(Vec<TextBlock>),
}

#[derive(Serialize, ToSchema)]
pub(super) struct TextBlock {
    #[serde(rename = "type")]
    kind: BlockType,
    text: String,
}

/// The one block type served.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum BlockType {
    Text,
}

/// A stop sequence: not empty (at least one character of any kind).
#[derive(Serialize, ToSchema)]
#[schema(pattern = r"[\s\S]")]
pub(super) struct StopSequence(String);

/// A whole message (a stream is `text/event-stream` of `message_start`,
/// `content_block_start`, `content_block_delta`, `content_block_stop`,
/// `message_delta` and `message_stop` events).
#[derive(Serialize, ToSchema)]
pub(super) struct Message {
    id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    kind: String,
    role: String,
    model: String,
    /// Thinking, text and tool_use blocks, as the model wrote them.
    content: Vec<AnswerBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`.
    stop_reason: String,
    stop_sequence: Option<String>,
    usage: MessageUsage,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum AnswerBlock {
    Text(TextBlock),
    Thinking(ThinkingBlock),
    ToolUse(ToolUseBlock),
}

#[derive(Serialize, ToSchema)]
pub(super) struct MessageUsage {
    input_tokens: u64,
    output_tokens: u64,
}

// ---------------------------------------------------------------------------
// the Responses route

/// `POST /v1/responses`. Fields not listed are refused.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ResponsesRequest {
    #[schema(min_length = 1)]
    model: String,
    /// A string (one user message), or a non-empty list of items.
    input: ResponsesInput,
    /// The system message; not carried over by `previous_response_id`.
    instructions: Option<String>,
    /// Function tools; refused (400) where the engine lacks the
    /// `tool_calls` capability or the model's template does not render
    /// tools.
    tools: Option<Vec<FunctionTool>>,
    tool_choice: Option<ResponsesToolChoice>,
    parallel_tool_calls: Option<bool>,
    #[schema(minimum = 1, maximum = 4294967295_u64)]
    max_output_tokens: Option<u64>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    temperature: Option<f64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    top_p: Option<f64>,
    stream: Option<bool>,
    /// Whether the response is stored for `GET /v1/responses/{id}` and
    /// `previous_response_id` (default true).
    store: Option<bool>,
    /// A stored response whose conversation this request continues.
    previous_response_id: Option<String>,
    text: Option<TextConfig>,
    reasoning: Option<ReasoningConfig>,
    metadata: Option<BTreeMap<String, String>>,
    user: Option<String>,
    truncation: Option<Truncation>,
    /// Accepted and ignored.
    include: Option<Vec<String>>,
    /// Only false: background responses are not served (true is a 400).
    background: Option<bool>,
    /// Accepted and ignored.
    prompt_cache_key: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum ResponsesInput {
    Text(String),
    /// Not empty.
    Items(Vec<InputItem>),
}

/// An input item: a message, an assistant's function call, a function's
/// output, or earlier reasoning (dropped).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum InputItem {
    Message(InputMessage),
    FunctionCall(FunctionCallItem),
    FunctionCallOutput(FunctionCallOutputItem),
    Reasoning(ReasoningItem),
}

#[derive(Serialize, ToSchema)]
pub(super) struct InputMessage {
    #[serde(rename = "type")]
    kind: Option<MessageType>,
    role: InputRole,
    /// A string or a list of text parts.
    content: InputContent,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum MessageType {
    Message,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum InputRole {
    User,
    Assistant,
    System,
    Developer,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum InputContent {
    Text(String),
    Parts(Vec<TextPart>),
}

/// Text; images and files are not served.
#[derive(Serialize, ToSchema)]
pub(super) struct TextPart {
    #[serde(rename = "type")]
    kind: TextPartType,
    text: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum TextPartType {
    InputText,
    OutputText,
}

#[derive(Serialize, ToSchema)]
pub(super) struct FunctionCallItem {
    #[serde(rename = "type")]
    kind: FunctionCallType,
    call_id: String,
    name: String,
    /// JSON text.
    arguments: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum FunctionCallType {
    FunctionCall,
}

#[derive(Serialize, ToSchema)]
pub(super) struct FunctionCallOutputItem {
    #[serde(rename = "type")]
    kind: FunctionCallOutputType,
    call_id: String,
    output: InputContent,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum FunctionCallOutputType {
    FunctionCallOutput,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ReasoningItem {
    #[serde(rename = "type")]
    kind: ReasoningType,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum ReasoningType {
    Reasoning,
}

/// A function tool, in the Responses API's flat shape.
#[derive(Serialize, ToSchema)]
pub(super) struct FunctionTool {
    #[serde(rename = "type")]
    kind: FunctionType,
    #[schema(min_length = 1)]
    name: String,
    description: Option<String>,
    /// A JSON Schema of the arguments.
    parameters: Option<BTreeMap<String, Value>>,
    strict: Option<bool>,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum ResponsesToolChoice {
    Mode(ToolChoiceMode),
    Function(NamedResponsesFunction),
}

#[derive(Serialize, ToSchema)]
pub(super) struct NamedResponsesFunction {
    #[serde(rename = "type")]
    kind: FunctionType,
    #[schema(min_length = 1)]
    name: String,
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TextConfig {
    format: Option<TextFormat>,
    verbosity: Option<Verbosity>,
}

/// `text`, `json_object`, or `json_schema` with `name` and `schema` (the
/// structured ones need the engine's `structured_output` capability).
#[derive(Serialize, ToSchema)]
pub(super) struct TextFormat {
    #[serde(rename = "type")]
    kind: TextFormatType,
    name: Option<String>,
    schema: Option<BTreeMap<String, Value>>,
    strict: Option<bool>,
    description: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum TextFormatType {
    Text,
    JsonObject,
    JsonSchema,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum Verbosity {
    Low,
    Medium,
    High,
}

/// `effort` as chat's `reasoning_effort` (gated by the engine's
/// capability); `summary` is ignored.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReasoningConfig {
    effort: Option<Effort>,
    summary: Option<String>,
    generate_summary: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum Effort {
    Low,
    Medium,
    High,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum Truncation {
    Auto,
    Disabled,
}

/// A response (a stream is `text/event-stream` of `response.created`,
/// `response.in_progress`, `response.output_item.added`,
/// `response.content_part.added`, `response.output_text.delta`, ...,
/// `response.output_item.done`, and `response.completed`,
/// `response.incomplete` or `response.failed`).
#[derive(Serialize, ToSchema)]
pub(super) struct ResponseObject {
    /// `resp_...`.
    id: String,
    /// Always `response`.
    object: String,
    created_at: u64,
    /// `completed`, `incomplete` (`incomplete_details` says why), `failed`
    /// or `in_progress`.
    status: String,
    model: String,
    /// Reasoning, message and function_call items, as the model wrote them.
    output: Vec<BTreeMap<String, Value>>,
    usage: Option<ResponseUsage>,
    incomplete_details: Option<BTreeMap<String, Value>>,
    error: Option<BTreeMap<String, Value>>,
    instructions: Option<String>,
    previous_response_id: Option<String>,
    tools: Vec<BTreeMap<String, Value>>,
    tool_choice: Value,
    parallel_tool_calls: bool,
    temperature: Option<f64>,
    top_p: Option<f64>,
    max_output_tokens: Option<u64>,
    store: bool,
    text: BTreeMap<String, Value>,
    reasoning: BTreeMap<String, Value>,
    metadata: BTreeMap<String, String>,
    truncation: String,
    user: Option<String>,
    background: bool,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ResponseUsage {
    input_tokens: u64,
    input_tokens_details: BTreeMap<String, u64>,
    output_tokens: u64,
    output_tokens_details: BTreeMap<String, u64>,
    total_tokens: u64,
}

/// `DELETE /v1/responses/{id}`.
#[derive(Serialize, ToSchema)]
pub(super) struct DeletedResponse {
    id: String,
    /// Always `response`.
    object: String,
    deleted: bool,
}

// ---------------------------------------------------------------------------
// management

/// `GET /health`; with the API key (or none set) also what is loading, the
/// pinned models, every model's state and every session.
#[derive(Serialize, ToSchema)]
pub(super) struct Health {
    /// `healthy` or `loading`.
    status: String,
    loading: Option<Vec<String>>,
    pinned: Option<BTreeMap<String, String>>,
    models: Option<BTreeMap<String, Value>>,
    sessions: Option<Vec<Value>>,
}

/// `GET /api/models`, `POST /api/models/rescan`.
#[derive(Serialize, ToSchema)]
pub(super) struct Models {
    models: Vec<Value>,
    not_models: Vec<Value>,
    rules: Vec<Value>,
}

/// `POST /api/models/{id}/load`.
#[derive(Serialize, ToSchema)]
pub(super) struct Loaded {
    loaded: bool,
    session: BTreeMap<String, Value>,
}

/// `POST /api/models/{id}/unload`.
#[derive(Serialize, ToSchema)]
pub(super) struct Unloaded {
    unloaded: bool,
    model: String,
    /// What the unload did, answered at once: `unloaded` (its engine is
    /// being stopped), `draining` (requests in flight may finish until the
    /// drain's deadline, then are ended with an error), `load_cancelled`.
    outcome: String,
    /// The same in words (`draining 2 requests, done in ≤ 30 s …`).
    message: String,
}

/// `DELETE /api/models/{id}`.
#[derive(Serialize, ToSchema)]
pub(super) struct Removed {
    removed: bool,
    model: String,
    /// Whether it was loaded and unloaded first (`force=true`).
    unloaded: bool,
    /// The bytes freed.
    bytes: u64,
    /// What was deleted: the model's file or folder (a link as the link),
    /// or for the Hugging Face cache the snapshot, the blobs no other
    /// snapshot uses and the refs naming it (the repository folder when it
    /// was the last snapshot).
    paths: Vec<String>,
}

/// `GET /api/resolve`.
#[derive(Serialize, ToSchema)]
pub(super) struct Resolved {
    /// The model, when the query named one (else it named a format).
    model: Option<BTreeMap<String, Value>>,
    resolution: BTreeMap<String, Value>,
}

/// `GET /api/sessions`.
#[derive(Serialize, ToSchema)]
pub(super) struct SessionList {
    sessions: Vec<Value>,
    models: BTreeMap<String, Value>,
    scheduler: BTreeMap<String, Value>,
}

/// `GET /api/sessions/{id}/logs`.
#[derive(Serialize, ToSchema)]
pub(super) struct Logs {
    session: String,
    model: String,
    dropped: u64,
    lines: Vec<String>,
}

/// `GET /api/events`.
#[derive(Serialize, ToSchema)]
pub(super) struct Events {
    events: Vec<Value>,
}

/// `GET /api/plugins`.
#[derive(Serialize, ToSchema)]
pub(super) struct Plugins {
    plugins: Vec<Value>,
}

// ---------------------------------------------------------------------------
// Ollama's API (`/ollama/api/*`)

/// An error, in Ollama's shape.
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaError {
    /// What happened and what to do.
    error: String,
}

/// `POST /api/chat`.
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaChatRequest {
    #[schema(min_length = 1)]
    model: String,
    /// Empty or absent: the model is loaded (with `keep_alive` 0, unloaded).
    messages: Option<Vec<OllamaMessage>>,
    /// OpenAI-style function tools.
    tools: Option<Vec<BTreeMap<String, Value>>>,
    format: Option<OllamaFormat>,
    options: Option<OllamaOptions>,
    /// Default true.
    stream: Option<bool>,
    keep_alive: Option<OllamaKeepAlive>,
    /// Whether the model's reasoning is passed on (`message.thinking`).
    think: Option<bool>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct OllamaMessage {
    role: OllamaRole,
    content: Option<String>,
    /// An assistant's calls: `{"function": {"name", "arguments": {...}}}`.
    tool_calls: Option<Vec<BTreeMap<String, Value>>>,
    /// The tool a `tool` message answers.
    tool_name: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum OllamaRole {
    System,
    User,
    Assistant,
    Tool,
}

/// `"json"`, or a JSON schema the answer follows; needs the engine's
/// `structured_output` capability.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum OllamaFormat {
    Json(OllamaJson),
    Schema(BTreeMap<String, Value>),
}

/// `"json"`, or `""` for none.
#[derive(Serialize, ToSchema)]
pub(super) enum OllamaJson {
    #[serde(rename = "json")]
    Json,
    #[serde(rename = "")]
    None,
}

/// A duration (`"5m"`, `"1h30m"`, `"0"`, `"-1"`) or seconds: 0 unloads the
/// model after the answer, negative keeps it loaded.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum OllamaKeepAlive {
    Text(String),
    Seconds(f64),
}

/// The options Hangar maps; Ollama's others (`num_ctx`, `repeat_penalty`,
/// …) are taken and ignored, keys Ollama does not define are refused.
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaOptions {
    #[schema(minimum = 0.0, maximum = 2.0)]
    temperature: Option<f64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    top_p: Option<f64>,
    #[schema(minimum = 0, maximum = 4294967295_u64)]
    top_k: Option<u64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    min_p: Option<f64>,
    seed: Option<i64>,
    /// The most tokens to generate; -1 or -2: no limit.
    #[schema(minimum = -2, maximum = 4294967295_u64)]
    num_predict: Option<i64>,
    stop: Option<Vec<String>>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    presence_penalty: Option<f64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    frequency_penalty: Option<f64>,
}

/// `POST /api/generate`.
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaGenerateRequest {
    #[schema(min_length = 1)]
    model: String,
    /// Empty or absent: the model is loaded (with `keep_alive` 0, unloaded).
    prompt: Option<String>,
    system: Option<String>,
    /// The prompt as written, completed without the chat template.
    raw: Option<bool>,
    format: Option<OllamaFormat>,
    options: Option<OllamaOptions>,
    /// Default true.
    stream: Option<bool>,
    keep_alive: Option<OllamaKeepAlive>,
    think: Option<bool>,
}

/// One line of `/api/chat` (the last has `done: true` and the counts).
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaChatLine {
    model: String,
    created_at: String,
    message: Option<BTreeMap<String, Value>>,
    done: bool,
    /// `stop`, `length`; `load` or `unload` without messages.
    done_reason: Option<String>,
    total_duration: Option<u64>,
    load_duration: Option<u64>,
    prompt_eval_count: Option<u64>,
    prompt_eval_duration: Option<u64>,
    eval_count: Option<u64>,
    eval_duration: Option<u64>,
}

/// One line of `/api/generate` (the last has `done: true` and the counts).
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaGenerateLine {
    model: String,
    created_at: String,
    response: String,
    thinking: Option<String>,
    done: bool,
    done_reason: Option<String>,
    total_duration: Option<u64>,
    load_duration: Option<u64>,
    prompt_eval_count: Option<u64>,
    prompt_eval_duration: Option<u64>,
    eval_count: Option<u64>,
    eval_duration: Option<u64>,
}

/// `DELETE /api/delete`.
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaDeleteRequest {
    /// The model's name (`name`, Ollama's older field, is taken too);
    /// `:latest` may follow it.
    #[schema(min_length = 1)]
    model: String,
}

/// `POST /api/show`.
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaShowRequest {
    #[schema(min_length = 1)]
    model: String,
    verbose: Option<bool>,
}

/// `/api/show`'s answer.
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaShow {
    modelfile: String,
    parameters: String,
    template: String,
    details: BTreeMap<String, Value>,
    model_info: BTreeMap<String, Value>,
    /// `completion`, and `tools` where the engine parses tool calls.
    capabilities: Vec<String>,
    modified_at: String,
}

/// `/api/tags`' and `/api/ps`' model.
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaModel {
    name: String,
    model: String,
    modified_at: String,
    size: u64,
    /// Names the model's path and size (not its content).
    digest: String,
    details: BTreeMap<String, Value>,
    /// `/api/ps`: when the model is unloaded if idle.
    expires_at: Option<String>,
    size_vram: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct OllamaTags {
    models: Vec<OllamaModel>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct OllamaPs {
    models: Vec<OllamaModel>,
}

/// Hangar's own version.
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaVersion {
    version: String,
}

/// `POST /ollama/api/embed`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct OllamaEmbedRequest {
    #[schema(min_length = 1)]
    model: String,
    /// A string or a list of strings (`[]` loads the model).
    input: OllamaEmbedInput,
    /// Accepted; Hangar never truncates (a long input is a 400).
    truncate: Option<bool>,
    options: Option<BTreeMap<String, Value>>,
    keep_alive: Option<Value>,
    #[schema(minimum = 1, maximum = 4294967295_u64)]
    dimensions: Option<u64>,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum OllamaEmbedInput {
    One(String),
    Many(Vec<String>),
}

/// The answer of `POST /ollama/api/embed`.
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaEmbed {
    model: String,
    embeddings: Vec<Vec<f32>>,
    total_duration: Option<u64>,
    load_duration: Option<u64>,
    prompt_eval_count: Option<u64>,
}

/// `POST /ollama/api/embeddings`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct OllamaEmbeddingsRequest {
    #[schema(min_length = 1)]
    model: String,
    #[schema(min_length = 1)]
    prompt: String,
    options: Option<BTreeMap<String, Value>>,
    keep_alive: Option<Value>,
}

/// The answer of `POST /ollama/api/embeddings`.
#[derive(Serialize, ToSchema)]
pub(super) struct OllamaEmbedding {
    embedding: Vec<f32>,
}
