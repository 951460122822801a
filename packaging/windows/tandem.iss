; Inno Setup script for Tandem (Windows). Packs dist\tandem\ (made by packaging/build.sh under Git
; Bash, or by the release workflow) into dist\tandem-<version>-windows-x64[-cuda]-setup.exe:
;
;   ISCC /DAppVersion=0.1.0 /DVariant=cpu  packaging\windows\tandem.iss
;   ISCC /DAppVersion=0.1.0 /DVariant=cuda packaging\windows\tandem.iss
;
; AppVersion must be app/__init__.py's __version__ (build.sh and the workflow read it from there).
; Per-user install by default (no administrator rights needed); the user may choose all users.

#ifndef AppVersion
  #error Pass /DAppVersion=<version> (from app/__init__.py)
#endif
#ifndef Variant
  #define Variant "cpu"
#endif
#if Variant == "cuda"
  #define Suffix "-cuda"
#else
  #define Suffix ""
#endif
#define SourceDir "..\..\dist\tandem"

[Setup]
AppId={{6B1D3A52-7C1E-4F0B-9D0B-3A7C2E1F5A10}
AppName=Tandem
AppVersion={#AppVersion}
AppVerName=Tandem {#AppVersion}
AppPublisher=Tandem
DefaultDirName={autopf}\Tandem
DefaultGroupName=Tandem
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir=..\..\dist
OutputBaseFilename=tandem-{#AppVersion}-windows-x64{#Suffix}-setup
SetupIconFile=..\..\build\icons\tandem.ico
UninstallDisplayIcon={app}\tandem.exe
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
LicenseFile=..\..\build\licenses\THIRD-PARTY-NOTICES.txt

[Files]
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\Tandem"; Filename: "{app}\tandem.exe"; WorkingDir: "{app}"
Name: "{autodesktop}\Tandem"; Filename: "{app}\tandem.exe"; WorkingDir: "{app}"; Tasks: desktopicon

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Run]
Filename: "{app}\tandem.exe"; Description: "{cm:LaunchProgram,Tandem}"; Flags: nowait postinstall skipifsilent
