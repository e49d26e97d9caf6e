//! `clearice`: parses arguments, installs logging, runs the CLI.

use clap::Parser;
use clearice_cli::{Cli, run};
use tracing_subscriber::EnvFilter;

fn main() {
    let cli = Cli::parse();
    let filter = EnvFilter::try_new(&cli.log_filter).unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error: cannot start the runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {}", clearice_cli::repl::one_line(&e));
            1
        }
    };
    std::process::exit(code);
}
