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
    // Two runtimes: the front end's (shell input, signals, progress; the server's network
    // IO) and the queries' (DataFusion's CPU work).
    // 8 MiB stacks: planning a deep statement under the policy recurses (2 MiB is
    // tokio's default).
    const STACK: usize = 8 << 20;
    let runtimes = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("clearice-io")
        .thread_stack_size(STACK)
        .enable_all()
        .build()
        .and_then(|io| {
            let cpu = tokio::runtime::Builder::new_multi_thread()
                .thread_name("clearice-cpu")
                .thread_stack_size(STACK)
                .enable_all()
                .build()?;
            Ok((io, cpu))
        });
    let (io, cpu) = match runtimes {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error: cannot start the runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = match io.block_on(run(cli, cpu.handle().clone())) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {}", clearice_cli::repl::one_line(&e));
            clearice_cli::exit_code(&e)
        }
    };
    cpu.shutdown_background();
    io.shutdown_background();
    std::process::exit(code);
}
