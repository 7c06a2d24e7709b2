//! The `plinth` binary: parse the command line, load the settings the command uses, set up
//! logging for the server, and run the command (`plinth::cli`). Nothing else.

use std::process::ExitCode;

use clap::Parser;
use plinth::cli::{Cli, Command};
use plinth::config::LogFormat;

fn telemetry(config: &plinth::config::Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log_level));
    use std::io::IsTerminal;
    // Colours only on a terminal: escape codes in a log file or journal hide the fields.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match config.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Settings that do not load are the doctor's first failed check, not an error.
    if let Command::Doctor(a) = &cli.command {
        return plinth::cli::doctor::run(cli.settings(), a).await;
    }
    let settings = cli.settings()?;
    if let (Command::Serve { .. }, Some(s)) = (&cli.command, &settings) {
        telemetry(&s.config);
    }
    plinth::cli::run(cli.command, settings.as_ref()).await
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(plinth::cli::report_usage(&e).clamp(0, 255) as u8),
    };
    let json_out = cli.command.json();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            plinth::cli::report_error(json_out, &e);
            ExitCode::FAILURE
        }
    }
}
