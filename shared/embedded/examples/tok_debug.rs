use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let b = LlamaBackend::init().unwrap();
    let m = LlamaModel::load_from_file(&b, &path, &LlamaModelParams::default()).unwrap();
    let v = m.vocab();
    println!("add_bos {} bos {:?} eos {:?} n_vocab {}", v.should_add_bos(), v.bos(), v.eos(), m.n_vocab());
    for s in ["<|im_start|>system\n", "<start_of_turn>user\n", "What is the capital of France?", "<end_of_turn>\n"] {
        let t = v.tokenize(s.as_bytes(), false, true);
        let pieces: Vec<String> =
            t.iter().map(|x| String::from_utf8_lossy(&v.token_to_piece(*x, true, None)).into_owned()).collect();
        println!("{s:?} -> {:?} {:?}", t.iter().map(|x| x.0).collect::<Vec<_>>(), pieces);
    }
    for k in ["tokenizer.chat_template", "general.architecture", "tokenizer.ggml.add_bos_token"] {
        println!("{k}: {:?}", m.meta_val_str(k).map(|s| s.chars().take(300).collect::<String>()));
    }
}
